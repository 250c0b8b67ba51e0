"""The operator's own Prometheus metrics (served on :8000/metrics)."""

from __future__ import annotations

import collections
import contextlib
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

RECONCILE_SECONDS = Histogram(
    "llm_operator_reconcile_duration_seconds",
    "Time to reconcile one LLMDeployment.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
RECONCILE_ERRORS = Counter("llm_operator_reconcile_errors_total", "Failed reconciles by reason.", ["reason"])
API_WRITES = Counter(
    "llm_operator_api_writes_total", "Write requests the operator sent, by kind and verb.", ["kind", "verb"]
)
DEPLOYMENTS = Gauge(
    "llm_operator_llmdeployments", "LLMDeployments by condition type and status.", ["condition", "status"]
)
REPLACED = Counter(
    "llm_operator_replaced_total",
    "Children deleted and created again because a field they were created with cannot change "
    "(a StatefulSet's selector), by kind.",
    ["kind"],
)
QUEUE_DEPTH = Gauge("llm_operator_queue_depth", "LLMDeployments waiting to be reconciled.")
LEADER = Gauge(
    "llm_operator_leader",
    "1 while this replica holds the leader Lease and reconciles (always 1 without leader election).",
)


class ConditionCounts:
    """DEPLOYMENTS kept by difference: a status write moves only its own conditions' counts (a
    recount over every deployment on each write grew with N squared)."""

    def __init__(self, gauge: Gauge = DEPLOYMENTS) -> None:
        self.gauge = gauge
        self._counts: collections.Counter[tuple[str, str]] = collections.Counter()

    def replace(self, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        before, after = _pairs(old), _pairs(new)
        if before == after:
            return
        self._counts.subtract(before)
        self._counts.update(after)
        for pair in set(before) | set(after):
            if self._counts[pair] > 0:
                self.gauge.labels(*pair).set(self._counts[pair])
            else:
                del self._counts[pair]
                with contextlib.suppress(KeyError):
                    self.gauge.remove(*pair)


def _pairs(status: dict[str, Any] | None) -> list[tuple[str, str]]:
    return [(c["type"], c["status"]) for c in (status or {}).get("conditions", [])]
