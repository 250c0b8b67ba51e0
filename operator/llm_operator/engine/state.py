"""An engine's state: what the cluster shows about its build, and what status reports of it."""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class PoolEngineStatus:
    state: EngineState
    cache_key: str | None = None
    uri: str | None = None
    job: str | None = None
    message: str = ""
