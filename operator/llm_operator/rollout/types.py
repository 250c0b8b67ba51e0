"""Canary rollout values shared by the pure decision code and the reconciler (the design of issue
12: /work/canary-contract.md). Placeholder holding only what the analysis queries produce: helper
"core" owns this module and defines the rest (Slot, SlotObserved, SlotTarget, Decision)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Measurement:
    """One window of one metric, for the canary revision (controller/analysis.py measures it;
    rollout/queries.py says what each value means)."""

    metric: str  # errorRate | p99Latency | timeToFirstToken | meanQueueTime
    value: float | None  # None = no data in the window
    requests: int  # requests the canary answered in the window (min-count check)
    error: str | None = None  # the query itself failed (unreachable Prometheus, bad answer)
