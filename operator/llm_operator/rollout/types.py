"""Values the rollout state machine reads and returns (machine.decide); no I/O here.

Status shapes (RevisionsStatus and its analysis) are the API's own models, since they are written
to status.revisions as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

from llm_operator.api.v1alpha1 import AnalysisMetric, RevisionsStatus, Slot

__all__ = ["AnalysisMetric", "Decision", "Event", "Measurement", "Slot", "SlotObserved", "SlotTarget"]


@dataclass(frozen=True)
class SlotObserved:
    """One slot's serving objects as observed.

    `ready` counts ready leader replicas that run `revision` (pods of another revision that are
    still being replaced must not count): the stable slot shrinks by ready canary replicas only.
    """

    revision: str | None
    replicas: int
    ready: int
    exists: bool


@dataclass(frozen=True)
class Measurement:
    """One window of one metric, for the canary revision."""

    metric: str  # an AnalysisMetric value
    value: float | None  # errorRate in percent, the others in ms; None = no data in the window
    requests: int  # requests the canary answered in the window (the minRequests check)
    error: str | None = None  # the query itself failed (unreachable Prometheus, bad answer)


@dataclass(frozen=True)
class SlotTarget:
    revision: str
    replicas: int


Event = tuple[str, str, str]  # (Normal | Warning, CamelCase reason, message in the user's words)


@dataclass(frozen=True)
class Decision:
    revisions: RevisionsStatus  # written to status.revisions
    slots: dict[Slot, SlotTarget]  # slots to render; a slot absent here is deleted
    weights: dict[str, int]  # {"stable": w, "canary": w} for the HTTPRoute (gateway-api)
    events: list[Event]
    requeue_after: float | None  # seconds to the next timer: pause end, measurement, scale-down
    measure: bool  # a measurement is due: query Prometheus and call decide again with it
