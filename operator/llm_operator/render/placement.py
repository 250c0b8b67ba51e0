"""Scheduling fields of serving pods, derived from the plan and spec.placement (docs/placement.md).

- Required node affinity to the pool's GPU products (the engine's architecture, and memory the
  plan fits), to spec.resources.gpu.minMemoryMiB and, where the plan's pool carries one, to the
  release's coarse CUDA driver floor (plan/floor.py; nodes whose driver GFD did not label stay
  allowed); the nvidia.com/gpu toleration.
- Workers of a multi-node replica follow their leader: required pod affinity on
  nvidia.com/gpu.clique when TP spans nodes (only NVLink is fast enough), else on the network
  block (or zone) label the planner found on the nodes, required or preferred per
  spec.placement.pipelineParallelStrictness.
- Replicas (their leaders) spread over zones or nodes with whenUnsatisfiable: ScheduleAnyway.
  DoNotSchedule would count zones whose GPUs are all taken, leaving a replica Pending while
  another zone has room; spreading is worth less than serving.
- No pod anti-affinity: a pod of a multi-node group holds more than half of its node's GPUs (the
  planner packs whole TP groups into as few pods as fit), and one that takes a whole node keeps
  every other GPU pod off it through its nvidia.com/gpu request. Where pods take part of a node,
  stacking replicas vs. fragmenting nodes is what replicaSpread: node decides. Inter-pod
  anti-affinity would only add the scheduler's most expensive check.
- The user's nodeSelector, tolerations and priorityClassName are merged, never replaced.
Only keys with content are returned, in a fixed order, so rendered objects diff cleanly.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from llm_operator import labels as L
from llm_operator.api.v1alpha1 import LLMDeploymentSpec, ReplicaSpread, Strictness
from llm_operator.plan.inventory import LabelKeys
from llm_operator.plan.types import PoolPlan


def _tolerations(spec: LLMDeploymentSpec) -> list[dict[str, Any]]:
    merged: dict[str, dict[str, Any]] = {}
    for t in [L.GPU_TOLERATION, *spec.placement.tolerations]:
        merged.setdefault(json.dumps(t, sort_keys=True), dict(t))
    return list(merged.values())


def node_selector_terms(expressions: list[dict[str, Any]], driver_floor: int | None) -> list[dict[str, Any]]:
    """`expressions` as required node affinity terms, each ANDed with one way a node meets the
    driver floor (terms are ORed): GFD's current driver label at least the floor; else its older
    label at least the floor; else neither label (an unknown driver is not checked). Gt is strict
    and compares integers: at least N is "greater than N-1"."""
    if driver_floor is None:
        return [{"matchExpressions": expressions}]
    (current, *_), (older, *_) = L.CUDA_DRIVER_LABELS
    at_least = [str(driver_floor - 1)]
    unlabeled = {"key": current, "operator": "DoesNotExist"}
    return [
        {"matchExpressions": [*expressions, *alternative]}
        for alternative in (
            [{"key": current, "operator": "Gt", "values": at_least}],
            [unlabeled, {"key": older, "operator": "Gt", "values": at_least}],
            [unlabeled, {"key": older, "operator": "DoesNotExist"}],
        )
    ]


def _node_affinity(spec: LLMDeploymentSpec, pool: PoolPlan) -> dict[str, Any]:
    expressions: list[dict[str, Any]] = [
        {"key": L.GPU_PRODUCT, "operator": "In", "values": list(pool.allowed_products)}
    ]
    min_memory = spec.resources.gpu.min_memory_mib
    if min_memory:
        expressions.append({"key": L.GPU_MEMORY, "operator": "Gt", "values": [str(min_memory - 1)]})
    terms = node_selector_terms(expressions, pool.driver_floor)
    return {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}


def _group_affinity(
    spec: LLMDeploymentSpec, pool: PoolPlan, group_selector: dict[str, str], label_keys: Sequence[str]
) -> dict[str, Any]:
    key = _group_domain(pool)
    if key is None:
        return {}
    term: dict[str, Any] = {"labelSelector": {"matchLabels": dict(group_selector)}}
    if label_keys:
        # The API server adds the pod's own values of these labels to the selector: its group only.
        term["matchLabelKeys"] = list(label_keys)
    term["topologyKey"] = key
    if pool.nvlink_clique or spec.placement.pipeline_parallel_strictness == Strictness.REQUIRED:
        return {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
    return {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]}


def _group_domain(pool: PoolPlan) -> str | None:
    """The label whose value a multi-node group's pods must share (None: no such constraint)."""
    return L.GPU_CLIQUE if pool.nvlink_clique else pool.group_topology_key


def _spread(
    spec: LLMDeploymentSpec, pool: PoolPlan, selector: dict[str, str], keys: LabelKeys
) -> list[dict[str, Any]]:
    spread = spec.placement.replica_spread
    # Every replica has exactly one leader pod: spreading leaders spreads replicas.
    leaders = {"matchLabels": {**selector, L.ROLE: "leader"}}
    constraints = []
    if spread != ReplicaSpread.NONE:
        key = keys.zone if spread == ReplicaSpread.ZONE else L.HOSTNAME
        constraints.append(
            {
                "maxSkew": 1,
                "topologyKey": key,
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": leaders,
            }
        )
    if (domain := _group_domain(pool)) is not None:
        # Nothing schedules a group as a gang: two leaders in one clique or block can leave too few
        # nodes there for their workers. Preferring leaders in different domains makes that rare.
        constraints.append(
            {
                "maxSkew": 1,
                "topologyKey": domain,
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": leaders,
            }
        )
    return constraints


def pod_scheduling(
    spec: LLMDeploymentSpec,
    pool: PoolPlan,
    *,
    selector: dict[str, str],
    group_selector: dict[str, str] | None,
    group_label_keys: Sequence[str] = (),
    leader: bool | None = None,
    inventory_labels: LabelKeys | None = None,
) -> dict[str, Any]:
    """Pod-spec fields (affinity, tolerations, topologySpreadConstraints, nodeSelector,
    priorityClassName) for one pool's serving pods. `selector` selects the pool's pods;
    `group_selector` (with `group_label_keys`, label keys whose values the pod brings) selects the
    pods a member of a multi-node group must be near: the StatefulSet shape gives workers their
    leader's labels; a LeaderWorkerSet gives every member its group-key label. None for single-pod
    replicas. Leaders (by default: pods without a group selector) are spread over zones or nodes;
    `inventory_labels` names the zone label (topology.kubernetes.io/zone by default)."""
    affinity: dict[str, Any] = {"nodeAffinity": _node_affinity(spec, pool)}
    if group_selector is not None and (
        pod_affinity := _group_affinity(spec, pool, group_selector, group_label_keys)
    ):
        affinity["podAffinity"] = pod_affinity
    fields: dict[str, Any] = {"affinity": affinity, "tolerations": _tolerations(spec)}
    is_leader = group_selector is None if leader is None else leader
    if is_leader and (spread := _spread(spec, pool, selector, inventory_labels or LabelKeys())):
        fields["topologySpreadConstraints"] = spread
    if spec.placement.node_selector:
        fields["nodeSelector"] = dict(sorted(spec.placement.node_selector.items()))
    if spec.placement.priority_class_name:
        fields["priorityClassName"] = spec.placement.priority_class_name
    return fields
