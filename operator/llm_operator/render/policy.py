"""PodDisruptionBudgets: voluntary evictions (node drains) take at most one replica at a time."""

from __future__ import annotations

from typing import Any

from llm_operator import labels as L
from llm_operator.plan.types import PoolPlan
from llm_operator.render import names
from llm_operator.rollout.revision import Slot


def disruption_budget(deployment: str, namespace: str, pool: PoolPlan, slot: Slot = Slot.A) -> dict[str, Any]:
    # Leaders stand for replicas; a worker eviction breaks its group just the same, so workers
    # are covered by the same selector (all serving pods of the pool) and budget. One budget per
    # slot: a drain may take one replica of the stable revision and one of the canary.
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": names.disruption_budget(deployment, pool, slot),
            "namespace": namespace,
            "labels": L.slot_labels(deployment, "serving", pool.name, slot),
        },
        "spec": {
            "maxUnavailable": 1,
            "selector": {
                "matchLabels": {**L.selector_labels(deployment), L.POOL: pool.name, L.SLOT: slot.value}
            },
            # Pods that never became ready may always be evicted: they serve nothing.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
