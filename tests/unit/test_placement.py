"""Placement rendering: whole outputs for representative pools, merging, and plan -> placement."""

from __future__ import annotations

import json
from typing import Any

from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.images import Images
from llm_operator.labels import GPU_TOLERATION
from llm_operator.plan.inventory import Inventory, LabelKeys
from llm_operator.plan.planner import plan_deployment
from llm_operator.plan.types import PoolPlan
from llm_operator.render.placement import pod_scheduling
from llm_operator.render.serving import LWS_GROUP_KEY, workloads

SELECTOR = {"llmoperator.io/deployment": "d", "llmoperator.io/pool": "main"}
LEADER_0 = {**SELECTOR, "llmoperator.io/role": "leader", "apps.kubernetes.io/pod-index": "0"}
H100S = ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-SXM5-80GB")
AWS_BLOCK = "topology.k8s.aws/network-node-layer-3"


def spec(placement: dict[str, Any] | None = None, **gpu: Any) -> LLMDeploymentSpec:
    return LLMDeploymentSpec.model_validate(
        {"model": {"name": "meta-llama/Meta-Llama-3-70B-Instruct", "source": {"uri": "pvc://models/m"}},
         "placement": placement or {}, "resources": {"gpu": gpu}}
    )  # fmt: skip


def pool(products: tuple[str, ...] = H100S, **layout: Any) -> PoolPlan:
    fields: dict[str, Any] = {"tensor": 4, "pipeline": 1, "gpus_per_pod": 4, "pods_per_replica": 1} | layout
    return PoolPlan("main", products[0], products, (9, 0), 81559, replicas=2, **fields)


def required_terms(out: dict[str, Any]) -> list[dict[str, Any]]:
    node_affinity = out["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return list(node_affinity["nodeSelectorTerms"][0]["matchExpressions"])


def test_single_node_replica_whole_output() -> None:
    out = pod_scheduling(spec(minMemoryMiB=80000), pool(), selector=SELECTOR, group_selector=None)
    assert out == {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "nvidia.com/gpu.product", "operator": "In", "values": list(H100S)},
                        {"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["79999"]},
                    ]}]
                }
            }
        },
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": {**SELECTOR, "llmoperator.io/role": "leader"}},
            }
        ],
    }  # fmt: skip
    assert list(out) == ["affinity", "tolerations", "topologySpreadConstraints"], "no empty keys"


def test_multi_node_clique_worker_follows_its_leader_into_the_clique() -> None:
    clique = pool(("NVIDIA-GB200",), tensor=8, gpus_per_pod=4, pods_per_replica=2, nvlink_clique=True,
                  group_topology_key="nvidia.com/gpu.clique")  # fmt: skip
    # Even with preferred strictness: TP across cliques would run over the network.
    out = pod_scheduling(spec({"pipelineParallelStrictness": "preferred"}), clique, selector=SELECTOR,
                         group_selector=LEADER_0)  # fmt: skip
    assert out["affinity"]["podAffinity"] == {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": LEADER_0}, "topologyKey": "nvidia.com/gpu.clique"}
        ]
    }
    assert "podAntiAffinity" not in out["affinity"]
    assert "topologySpreadConstraints" not in out, "workers go where their leader is"
    leader = pod_scheduling(spec(), clique, selector=SELECTOR, group_selector=None)
    assert "podAffinity" not in leader["affinity"]
    # Leaders prefer different cliques, so two groups do not crowd one clique their workers then
    # cannot fit in (there is no gang scheduling); soft, like the zone spread.
    spread = {c["topologyKey"]: c["whenUnsatisfiable"] for c in leader["topologySpreadConstraints"]}
    assert spread == {
        "topology.kubernetes.io/zone": "ScheduleAnyway",
        "nvidia.com/gpu.clique": "ScheduleAnyway",
    }
    single = pod_scheduling(spec(), pool(), selector=SELECTOR, group_selector=None)
    assert [c["topologyKey"] for c in single["topologySpreadConstraints"]] == ["topology.kubernetes.io/zone"]


def test_pipeline_worker_stays_in_the_planned_block_required_or_preferred() -> None:
    pp = pool(tensor=8, pipeline=2, gpus_per_pod=8, pods_per_replica=2, group_topology_key=AWS_BLOCK)
    required = pod_scheduling(spec(), pp, selector=SELECTOR, group_selector=LEADER_0)
    (term,) = required["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term == {"labelSelector": {"matchLabels": LEADER_0}, "topologyKey": AWS_BLOCK}
    preferred = pod_scheduling(spec({"pipelineParallelStrictness": "preferred"}), pp, selector=SELECTOR,
                               group_selector=LEADER_0)  # fmt: skip
    assert preferred["affinity"]["podAffinity"] == {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]
    }
    anywhere = pool(tensor=8, pipeline=2, gpus_per_pod=8, pods_per_replica=2, group_topology_key=None)
    out = pod_scheduling(
        spec({"pipelineParallelDomain": "any"}), anywhere, selector=SELECTOR, group_selector=LEADER_0
    )
    assert "podAffinity" not in out["affinity"]


def test_pcie_pool_spread_over_nodes() -> None:
    l40s = PoolPlan("pcie", "NVIDIA-L40S", ("NVIDIA-L40S",), (8, 9), 46068, 2, 1, 2, 1, 3)
    selector = {**SELECTOR, "llmoperator.io/pool": "pcie"}
    out = pod_scheduling(spec({"replicaSpread": "node"}), l40s, selector=selector, group_selector=None)
    assert required_terms(out) == [
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-L40S"]}
    ]
    (tsc,) = out["topologySpreadConstraints"]
    assert (tsc["topologyKey"], tsc["whenUnsatisfiable"]) == ("kubernetes.io/hostname", "ScheduleAnyway")
    assert tsc["labelSelector"]["matchLabels"]["llmoperator.io/pool"] == "pcie"
    assert "podAntiAffinity" not in out["affinity"]
    none = pod_scheduling(spec({"replicaSpread": "none"}), l40s, selector=selector, group_selector=None)
    assert "topologySpreadConstraints" not in none


def test_user_settings_are_merged_without_duplicates() -> None:
    dedicated = {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}
    reordered_gpu = {"effect": "NoSchedule", "operator": "Exists", "key": "nvidia.com/gpu"}
    s = spec({"tolerations": [dedicated, reordered_gpu, dict(dedicated)],
              "nodeSelector": {"z": "1", "a": "2"}, "priorityClassName": "llm-critical"})  # fmt: skip
    out = pod_scheduling(s, pool(), selector=SELECTOR, group_selector=None)
    assert out["tolerations"] == [GPU_TOLERATION, dedicated]
    assert json.dumps(out["nodeSelector"]) == '{"a": "2", "z": "1"}'
    assert out["priorityClassName"] == "llm-critical"
    assert list(out) == [
        "affinity",
        "tolerations",
        "topologySpreadConstraints",
        "nodeSelector",
        "priorityClassName",
    ]


def test_custom_zone_label_and_deterministic_output() -> None:
    keys = LabelKeys(zone="example.com/zone")
    first = pod_scheduling(spec(), pool(), selector=SELECTOR, group_selector=None, inventory_labels=keys)
    assert first["topologySpreadConstraints"][0]["topologyKey"] == "example.com/zone"
    again = pod_scheduling(spec(), pool(), selector=SELECTOR, group_selector=None, inventory_labels=keys)
    assert json.dumps(first) == json.dumps(again)
    first["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ].clear()
    assert pod_scheduling(spec(), pool(), selector=SELECTOR, group_selector=None) != first, "no shared state"


def test_planned_gb200_group_renders_clique_affinity() -> None:
    nodes = [
        {"metadata": {"name": f"g{i}", "labels": {"nvidia.com/gpu.product": "NVIDIA-GB200",
                                                  "nvidia.com/gpu.clique": "c.1", AWS_BLOCK: "b1"}},
         "status": {"allocatable": {"nvidia.com/gpu": "4"}}}
        for i in range(2)
    ]  # fmt: skip
    s = LLMDeploymentSpec.model_validate(
        {"model": {"name": "meta-llama/Meta-Llama-3-70B-Instruct", "source": {"uri": "pvc://models/m"}},
         "parallelism": {"tensor": 8, "pipeline": 1}, "resources": {"gpu": {"products": ["NVIDIA-GB200"]}}}
    )  # fmt: skip
    planned = plan_deployment(s, Inventory(nodes), 1).primary
    worker = pod_scheduling(s, planned, selector=SELECTOR, group_selector=LEADER_0)
    (term,) = worker["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "nvidia.com/gpu.clique"
    assert required_terms(worker)[0]["values"] == ["NVIDIA-GB200"]


def test_leader_worker_set_keeps_each_group_in_one_clique_and_spreads_leaders() -> None:
    nodes = [
        {"metadata": {"name": f"g{i}", "labels": {"nvidia.com/gpu.product": "NVIDIA-GB200",
                                                  "nvidia.com/gpu.clique": f"c.{i // 2}", AWS_BLOCK: "b1"}},
         "status": {"allocatable": {"nvidia.com/gpu": "4"}}}
        for i in range(4)
    ]  # fmt: skip
    s = LLMDeploymentSpec.model_validate(
        {"model": {"name": "meta-llama/Meta-Llama-3-70B-Instruct", "source": {"uri": "pvc://models/m"}},
         "parallelism": {"tensor": 8, "pipeline": 1}, "resources": {"gpu": {"products": ["NVIDIA-GB200"]}}}
    )  # fmt: skip
    planned = plan_deployment(s, Inventory(nodes), 2).primary
    (lws,) = workloads(
        "llama",
        "ns",
        s,
        planned,
        Images("r", "c", "b", "0.20.0"),
        None,
        "h",
        uid="",
        revision="r1",
        leader_worker_set=True,
    )
    template = lws["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        pod = template[role]["spec"]
        (term,) = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "nvidia.com/gpu.clique"
        assert term["matchLabelKeys"] == [LWS_GROUP_KEY], "the selector must narrow to the pod's own group"
        assert term["labelSelector"]["matchLabels"] == {"llmoperator.io/deployment": "llama",
                                                        "llmoperator.io/pool": planned.name,
                                                        "llmoperator.io/slot": "a"}  # fmt: skip
    assert "topologySpreadConstraints" in template["leaderTemplate"]["spec"]
    assert "topologySpreadConstraints" not in template["workerTemplate"]["spec"]
