"""Placement rendering: products, toleration merging, group co-location, zone spread."""

from __future__ import annotations

from typing import Any

from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.plan.types import PoolPlan
from llm_operator.render.placement import GPU_TOLERATION, pod_scheduling

SELECTOR = {"llmoperator.io/deployment": "d", "llmoperator.io/pool": "main"}


def spec(placement: dict[str, Any] | None = None, **gpu: Any) -> LLMDeploymentSpec:
    return LLMDeploymentSpec.model_validate(
        {"model": {"name": "m", "source": {"uri": "s3://m"}}, "placement": placement or {},
         "resources": {"gpu": gpu}}
    )  # fmt: skip


def pool(clique: bool = False) -> PoolPlan:
    products = ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-SXM5-80GB")
    return PoolPlan("main", "NVIDIA-H100-80GB-HBM3", products, (9, 0),
                    81559, 8, 2, 8, 2, 2, nvlink_clique=clique)  # fmt: skip


def test_required_products_memory_and_gpu_toleration() -> None:
    out = pod_scheduling(spec(minMemoryMiB=80000), pool(), selector=SELECTOR, group_selector=None)
    terms = out["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    exprs = {e["key"]: e for e in terms[0]["matchExpressions"]}
    assert exprs["nvidia.com/gpu.product"]["values"] == ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-SXM5-80GB"]
    assert exprs["nvidia.com/gpu.memory"] == {
        "key": "nvidia.com/gpu.memory",
        "operator": "Gt",
        "values": ["79999"],
    }
    assert out["tolerations"] == [GPU_TOLERATION]


def test_user_settings_merged_not_replaced() -> None:
    user = {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}
    s = spec(
        {"tolerations": [user, GPU_TOLERATION], "nodeSelector": {"pool": "llm"}, "priorityClassName": "hi"}
    )
    out = pod_scheduling(s, pool(), selector=SELECTOR, group_selector=None)
    assert out["tolerations"] == [GPU_TOLERATION, user]
    assert out["nodeSelector"] == {"pool": "llm"}
    assert out["priorityClassName"] == "hi"


def test_replicas_spread_over_zones_as_a_preference() -> None:
    out = pod_scheduling(spec(), pool(), selector=SELECTOR, group_selector=None)
    (tsc,) = out["topologySpreadConstraints"]
    assert tsc["topologyKey"] == "topology.kubernetes.io/zone"
    assert tsc["whenUnsatisfiable"] == "ScheduleAnyway"
    assert tsc["labelSelector"]["matchLabels"]["llmoperator.io/role"] == "leader"
    none = pod_scheduling(spec({"replicaSpread": "none"}), pool(), selector=SELECTOR, group_selector=None)
    assert "topologySpreadConstraints" not in none


def test_workers_follow_their_leader_into_the_clique_or_block() -> None:
    leader = {**SELECTOR, "llmoperator.io/role": "leader", "apps.kubernetes.io/pod-index": "0"}
    clique = pod_scheduling(spec(), pool(clique=True), selector=SELECTOR, group_selector=leader)
    (term,) = clique["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term == {"labelSelector": {"matchLabels": leader}, "topologyKey": "nvidia.com/gpu.clique"}
    block = pod_scheduling(spec(), pool(), selector=SELECTOR, group_selector=leader)
    (term,) = block["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "topology.k8s.aws/network-node-layer-3"
    preferred = pod_scheduling(
        spec({"pipelineParallelStrictness": "preferred"}), pool(), selector=SELECTOR, group_selector=leader
    )
    assert "preferredDuringSchedulingIgnoredDuringExecution" in preferred["affinity"]["podAffinity"]
