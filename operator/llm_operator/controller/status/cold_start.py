"""A serving replica's cold start: what it is, and how status and Events report it (pure).

A start is measured from what the API server says about the pod (controller/observe/cold_start.py):
its creation, the PodScheduled condition, its init containers' end, its serving container's start
and the Ready condition, each phase ending at one of them. status.lastColdStart keeps the latest;
each start is one Normal Event, ColdStart, posted once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

EVENT_REASON = "ColdStart"
# The phases in order, each named after the moment it ends (docs/autoscaling.md, "Cold starts").
PHASES = ("scheduled", "initialized", "started", "ready")


@dataclass(frozen=True)
class ColdStart:
    """One replica's start from nothing: a new pod, or for a multi-node group its slowest member."""

    key: str  # the pods' uids: a start is reported once
    pod: str  # the pod measured (a group's slowest member)
    pods: int  # pods of the replica (1, or the group's size)
    started_at: str  # the pod's creationTimestamp
    ready_at: str  # its Ready condition's lastTransitionTime
    phases: tuple[tuple[str, int], ...]  # (name, seconds), adding up to total
    group: str = ""  # "group 0 of pool main" for a multi-node replica
    seen_starting: bool = False  # this operator saw it before it was Ready: never reported before

    @property
    def total(self) -> int:
        return sum(seconds for _, seconds in self.phases)

    def fields(self) -> dict[str, Any]:
        return {
            "podName": self.pod,
            "pods": self.pods,
            "startedAt": self.started_at,
            "readyAt": self.ready_at,
            "phases": [{"name": name, "seconds": seconds} for name, seconds in self.phases],
            "totalSeconds": self.total,
        }

    def message(self) -> str:
        who = f"{self.group} ({self.pods} pods), slowest {self.pod}" if self.group else f"pod {self.pod}"
        parts = ", ".join(f"{name} {seconds} s" for name, seconds in self.phases)
        return f"{who} started from nothing in {self.total} s: {parts}"


def _at(timestamp: str) -> datetime:
    return datetime.fromisoformat(timestamp)


def phases(moments: list[tuple[str, str | None]], start: str) -> tuple[tuple[str, int], ...]:
    """Whole seconds between consecutive moments, from `start`. A moment that is unknown or earlier
    than the one before it (clocks of the scheduler's and the kubelet's machines differ) ends its
    phase where the previous one ended, so no phase is negative and they add up to the total."""
    out, before = [], _at(start)
    for name, moment in moments:
        at = max(before, _at(moment)) if moment else before
        out.append((name, int((at - before).total_seconds())))
        before = at
    return tuple(out)


def report(
    starts: tuple[ColdStart, ...], old_status: dict[str, Any] | None
) -> tuple[dict[str, Any] | None, list[ColdStart]]:
    """status.lastColdStart, and the starts to post an Event for: those not yet reported (the
    observation holds only those). A start this operator first saw already Ready may have been
    reported by its predecessor: it is news only if it became Ready after the one status keeps (one
    Ready in the same second, unreported when the predecessor stopped, goes unreported)."""
    old = (old_status or {}).get("lastColdStart")
    if old is not None:
        starts = tuple(s for s in starts if s.seen_starting or _at(s.ready_at) > _at(old["readyAt"]))
    news = sorted(starts, key=lambda s: (_at(s.ready_at), s.pod))
    if news and (old is None or _at(news[-1].ready_at) >= _at(old["readyAt"])):
        return news[-1].fields(), news
    return old, news
