"""PodDisruptionBudgets: voluntary evictions (node drains) take at most one replica at a time."""

from __future__ import annotations

from typing import Any

from llm_operator import labels as L
from llm_operator.plan.types import PoolPlan
from llm_operator.render import names


def disruption_budget(deployment: str, namespace: str, pool: PoolPlan) -> dict[str, Any]:
    # Leaders stand for replicas; a worker eviction breaks its group just the same, so workers
    # are covered by the same selector (all serving pods of the pool) and budget.
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": names.disruption_budget(deployment, pool),
            "namespace": namespace,
            "labels": {**L.common_labels(deployment, "serving"), L.POOL: pool.name},
        },
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": {**L.selector_labels(deployment), L.POOL: pool.name}},
            # Pods that never became ready may always be evicted: they serve nothing.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
