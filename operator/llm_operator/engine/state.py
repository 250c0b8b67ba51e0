"""An engine's state: what the cluster shows about its build, and what status reports of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class BuildFact(StrEnum):
    """What the cluster shows for one cache key: the engine index, else its build Job."""

    RECORDED = "Recorded"  # in the namespace's engine index: built before, by any deployment
    COMPLETE = "Complete"  # its Job succeeded; the index does not list it yet
    FAILED = "Failed"
    RUNNING = "Running"
    ABSENT = "Absent"  # neither indexed nor a Job: the build has not started


@dataclass(frozen=True)
class BuildObserved:
    fact: BuildFact
    message: str = ""  # the Job's reason and message when it failed


class EngineState(StrEnum):
    NOT_NEEDED = "NotNeeded"
    READY = "Ready"
    BUILDING = "Building"
    FAILED = "Failed"
    WAITING = "WaitingForModel"  # its build needs the model's files, which are being fetched


@dataclass(frozen=True)
class PoolEngineStatus:
    state: EngineState
    cache_key: str | None = None
    uri: str | None = None
    job: str | None = None
    message: str = ""


class ModelFact(StrEnum):
    """What the cluster shows for one fetch key: the model cache index, else the fetch Job."""

    RECORDED = "Recorded"  # in the namespace's llm-model-cache-index: fetched before, by anyone
    COMPLETE = "Complete"  # its Job succeeded; the index does not list it yet
    FAILED = "Failed"
    RUNNING = "Running"
    ABSENT = "Absent"


@dataclass(frozen=True)
class ModelObserved:
    fact: ModelFact
    directory: str = ""  # models/<source key>/<resolved revision>, inside the claim
    resolved_revision: str = ""
    bytes: int | None = None  # in all (RECORDED, COMPLETE)
    total_bytes: int | None = None
    files: int | None = None
    total_files: int | None = None
    reason: str = ""  # FAILED: the fetcher's reason (SourceUnauthorized, ...) or the Job's
    message: str = ""  # FAILED: the fetcher's one line, naming the field to fix
    started: str = ""  # RUNNING: the Job's startTime


class ModelState(StrEnum):
    NOT_CACHED = "NotCached"  # pvc:// and builtin:// sources are read in place
    READY = "Ready"
    FETCHING = "Fetching"
    FAILED = "Failed"


@dataclass(frozen=True)
class ModelStatus:
    """What status.model and the ModelCached condition say (controller/status/status.py)."""

    state: ModelState
    cache_key: str = ""
    job: str = ""
    observed: ModelObserved = field(default_factory=lambda: ModelObserved(ModelFact.ABSENT))
