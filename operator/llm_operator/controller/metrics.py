"""The operator's own Prometheus metrics (served on :8000/metrics)."""

from __future__ import annotations

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
