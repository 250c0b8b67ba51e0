"""Placement of serving pods, derived from the plan and spec.placement (docs/placement.md).

- required node affinity to the pool's GPU products (same architecture as its engine) and to the
  minimum GPU memory; the nvidia.com/gpu toleration;
- multi-node groups: workers stay with their leader inside one NVLink clique (TP across nodes) or
  one network block / zone (PP across nodes), required or preferred as the spec says;
- replicas spread over zones (or nodes) and kept off each other's nodes where possible, as
  preferences: a zone without capacity must not make a replica unschedulable;
- the user's nodeSelector, tolerations and priorityClassName are merged, never replaced.
"""

from __future__ import annotations

import json
from typing import Any

from llm_operator import labels as L
from llm_operator.api.v1alpha1 import LLMDeploymentSpec, PipelineParallelDomain, ReplicaSpread, Strictness
from llm_operator.plan.inventory import LabelKeys
from llm_operator.plan.types import PoolPlan

GPU_TOLERATION = {"key": L.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}


def _tolerations(spec: LLMDeploymentSpec) -> list[dict[str, Any]]:
    merged: list[dict[str, Any]] = []
    for t in [GPU_TOLERATION, *spec.placement.tolerations]:
        if all(json.dumps(t, sort_keys=True) != json.dumps(m, sort_keys=True) for m in merged):
            merged.append(dict(t))
    return merged


def _node_affinity(spec: LLMDeploymentSpec, pool: PoolPlan) -> dict[str, Any]:
    expressions: list[dict[str, Any]] = [
        {"key": L.GPU_PRODUCT, "operator": "In", "values": list(pool.allowed_products)}
    ]
    if spec.resources.gpu.min_memory_mib:
        expressions.append(
            {"key": L.GPU_MEMORY, "operator": "Gt", "values": [str(spec.resources.gpu.min_memory_mib - 1)]}
        )
    return {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": expressions}]
        }
    }


def _group_topology_key(spec: LLMDeploymentSpec, pool: PoolPlan, keys: LabelKeys) -> str | None:
    if pool.nvlink_clique:
        return L.GPU_CLIQUE  # TP spans nodes: only NVLink within one clique is fast enough
    domain = spec.placement.pipeline_parallel_domain
    if domain == PipelineParallelDomain.NETWORK_BLOCK:
        return keys.network_block[0]
    if domain == PipelineParallelDomain.ZONE:
        return keys.zone
    return None


def pod_scheduling(
    spec: LLMDeploymentSpec,
    pool: PoolPlan,
    *,
    selector: dict[str, str],
    group_selector: dict[str, str] | None,
    inventory_labels: LabelKeys | None = None,
) -> dict[str, Any]:
    """Pod-spec fields (affinity, tolerations, topologySpreadConstraints, nodeSelector,
    priorityClassName) for one pool's serving pods. `group_selector` selects the leader a worker
    belongs with (None for leaders and single-pod replicas)."""
    keys = inventory_labels or LabelKeys()
    affinity: dict[str, Any] = {"nodeAffinity": _node_affinity(spec, pool)}
    result: dict[str, Any] = {"affinity": affinity, "tolerations": _tolerations(spec)}
    if group_selector is not None:
        key = _group_topology_key(spec, pool, keys)
        if key is not None:
            term = {"labelSelector": {"matchLabels": group_selector}, "topologyKey": key}
            required = (
                pool.nvlink_clique or spec.placement.pipeline_parallel_strictness == Strictness.REQUIRED
            )
            affinity["podAffinity"] = (
                {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
                if required
                else {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 100, "podAffinityTerm": term}
                    ]
                }
            )
    else:
        spread = spec.placement.replica_spread
        if spread != ReplicaSpread.NONE:
            leaders = {**selector, L.ROLE: "leader"}
            affinity["podAntiAffinity"] = {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 100, "podAffinityTerm": {"labelSelector": {"matchLabels": leaders},
                                                        "topologyKey": L.HOSTNAME}}
                ]
            }  # fmt: skip
            result["topologySpreadConstraints"] = [
                {
                    "maxSkew": 1,
                    "topologyKey": keys.zone if spread == ReplicaSpread.ZONE else L.HOSTNAME,
                    "whenUnsatisfiable": "ScheduleAnyway",
                    "labelSelector": {"matchLabels": leaders},
                }
            ]
    if spec.placement.node_selector:
        result["nodeSelector"] = dict(spec.placement.node_selector)
    if spec.placement.priority_class_name:
        result["priorityClassName"] = spec.placement.priority_class_name
    return result
