"""A small simulated cluster for the rollout state machine: slots follow the decisions, pods get
ready when the test says so, time moves when the test says so. Pure, no Kubernetes."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from llm_operator.api.v1alpha1 import LLMDeploymentSpec, RevisionsStatus
from llm_operator.rollout.machine import decide
from llm_operator.rollout.types import Decision, Measurement, Slot, SlotObserved

T0 = datetime(2026, 11, 23, 20, 0, 0, tzinfo=UTC)
PROM = {"url": "http://prometheus:9090"}


def spec(canary: dict[str, Any] | None = None, strategy: str = "canary") -> LLMDeploymentSpec:
    rollout: dict[str, Any] = {"strategy": strategy}
    if canary is not None:
        rollout["canary"] = canary
    return LLMDeploymentSpec.model_validate(
        {
            "model": {"name": "tiny", "source": {"uri": "builtin://tiny-llama"}},
            "engine": {"backend": "cpu-reference", "precision": "fp16"},
            "rollout": rollout,
        }
    )


def analysis(**fields: Any) -> dict[str, Any]:
    return {"prometheus": PROM, "intervalSeconds": 60, "minRequests": 20, **fields}


def good(*metrics: str, requests: int = 100) -> list[Measurement]:
    return [Measurement(m, 1.0 if m == "errorRate" else 100.0, requests) for m in metrics]


@dataclass
class World:
    spec: LLMDeploymentSpec
    revision: str
    total: int
    now: datetime = T0
    status: RevisionsStatus | None = None
    slots: dict[Slot, SlotObserved] = field(default_factory=dict)
    route_ready: bool = True
    problems: dict[Slot, tuple[str, ...]] = field(default_factory=dict)  # "pod: why" per slot
    events: list[tuple[str, str, str]] = field(default_factory=list)
    last: Decision | None = None

    def decide(self, measurements: list[Measurement] | None = None, action: str | None = None) -> Decision:
        d = decide(
            self.spec,
            self.revision,
            self.status,
            dict(self.slots),
            self.total,
            measurements,
            action,
            self.now,
            self.route_ready,
            self.problems,
        )
        # Through JSON as the API server stores it: every call is what a restarted operator sees.
        self.status = RevisionsStatus.model_validate(
            d.revisions.model_dump(mode="json", by_alias=True, exclude_none=True)
        )
        self.last = d
        self.events += d.events
        self.apply(d)
        return d

    def apply(self, d: Decision) -> None:
        """The StatefulSets take the new replicas at once; a new template makes its pods unready,
        scaling down removes ready pods at once, scaling up waits for ready()."""
        slots: dict[Slot, SlotObserved] = {}
        for slot, target in d.slots.items():
            seen = self.slots.get(slot)
            ready = seen.ready if seen is not None and seen.revision == target.revision else 0
            slots[slot] = SlotObserved(target.revision, target.replicas, min(ready, target.replicas), True)
        self.slots = slots

    def ready(self, limit: int | None = None) -> None:
        """Pods become ready: all of them, or up to `limit` more per slot."""
        for slot, seen in list(self.slots.items()):
            more = seen.replicas - seen.ready if limit is None else min(limit, seen.replicas - seen.ready)
            self.slots[slot] = SlotObserved(seen.revision, seen.replicas, seen.ready + more, True)

    def wait(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def settle(self, measurements: list[Measurement] | None = None, rounds: int = 6) -> Decision:
        """Reconcile until nothing changes: pods ready, measurements taken when asked."""
        d = self.decide()
        for _ in range(rounds):
            if d.measure:
                d = self.decide(measurements=measurements)
            self.ready()
            before = (self.status, self.slots)
            d = self.decide()
            if (self.status, self.slots) == before and not d.measure:
                break
        return d

    def reasons(self) -> list[str]:
        return [reason for _, reason, _ in self.events]

    def serving(self) -> dict[str, int]:
        """Ready replicas per revision."""
        out: dict[str, int] = {}
        for seen in self.slots.values():
            if seen.revision is not None:
                out[seen.revision] = out.get(seen.revision, 0) + seen.ready
        return out
