"""Planner and memory model: worked examples, invariants (hypothesis), optimality vs brute force."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.plan import memory
from llm_operator.plan.catalogue import lookup
from llm_operator.plan.inventory import Inventory
from llm_operator.plan.planner import plan_deployment
from llm_operator.plan.types import PlanningError

from bench.planner import optimum as brute_force_min_gpus

GIB = memory.GIB


def spec(**overrides: Any) -> LLMDeploymentSpec:
    doc: dict[str, Any] = {
        "model": {"name": "meta-llama/Meta-Llama-3-70B-Instruct", "source": {"uri": "s3://m/x"}},
        "engine": {"precision": "fp16", "maxBatchSize": 16, "maxInputLen": 2048, "maxSeqLen": 4096,
                   "maxNumTokens": 4096},
        "parallelism": {"tensor": "auto", "pipeline": "auto"},
    }  # fmt: skip
    for path, value in overrides.items():
        node = doc
        *parents, leaf = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return LLMDeploymentSpec.model_validate(doc)


def node(
    name: str, product: str, gpus: int, memory_mib: int, cc: tuple[int, int], **labels: str
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {
            "nvidia.com/gpu.product": product, "nvidia.com/gpu.memory": str(memory_mib),
            "nvidia.com/gpu.compute.major": str(cc[0]), "nvidia.com/gpu.compute.minor": str(cc[1]),
            "topology.kubernetes.io/zone": "z1", **labels}},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip


def test_reference_worked_example_llama3_70b_tp4() -> None:
    """triton-trtllm.md section 6: fp16 tp4 -> ~35.3 GB weights, 80 KiB of KV per token per GPU."""
    s = spec()
    arch = lookup(s.model)
    assert arch is not None
    fit = memory.per_gpu(arch, s, 4, 1, 81559)
    assert fit.weights / 1e9 == pytest.approx(35.3, abs=0.1)
    assert memory.kv_bytes_per_token(arch, s, 4, 1) == 80 * 1024
    # KV heads are replicated once tp exceeds them (8 KV heads, tp 16 -> 1 head per rank).
    assert memory.kv_bytes_per_token(arch, s, 16, 1) == memory.kv_bytes_per_token(arch, s, 8, 1)


def test_auto_prefers_fewest_gpus_and_product_order() -> None:
    inv = Inventory([node("h", "NVIDIA-H100-80GB-HBM3", 8, 81559, (9, 0)),
                     node("a", "NVIDIA-A100-SXM4-40GB", 8, 40960, (8, 0))])  # fmt: skip
    plan = plan_deployment(spec(), inv, 1)
    pool = plan.primary
    # 70B fp16 needs 2 H100s (65.7 GiB weights each) but 4 A100-40GBs: fewer GPUs wins.
    assert (pool.gpu_product, pool.tensor, pool.pipeline, pool.pods_per_replica) == (
        "NVIDIA-H100-80GB-HBM3",
        2,
        1,
        1,
    )
    assert "fit in" in plan.reason


def test_fp8_is_never_planned_on_ampere() -> None:
    inv = Inventory([node("a", "NVIDIA-A100-SXM4-40GB", 8, 40960, (8, 0))])
    with pytest.raises(PlanningError) as err:
        plan_deployment(spec(**{"engine.precision": "fp8"}), inv, 1)
    assert err.value.reason == "PrecisionUnsupported"
    assert "8.9" in err.value.message


def test_impossible_tp_says_what_is_missing() -> None:
    inv = Inventory([node("l0", "NVIDIA-L40S", 4, 46068, (8, 9))])
    s = spec(
        **{"parallelism.tensor": 8, "parallelism.pipeline": 1, "resources.gpu.products": ["NVIDIA-L40S"]}
    )
    with pytest.raises(PlanningError) as err:
        plan_deployment(s, inv, 1)
    assert err.value.reason == "InsufficientGPUs"
    assert err.value.message.startswith("no node offers 8 allocatable NVIDIA-L40S GPUs")
    assert "largest is 4 on l0" in err.value.message


def test_multi_node_tp_only_inside_a_clique() -> None:
    nodes = [
        node(f"g{i}", "NVIDIA-GB200", 4, 189471, (10, 0), **{"nvidia.com/gpu.clique": "c.1"})
        for i in range(2)
    ]
    s = spec(
        **{"parallelism.tensor": 8, "parallelism.pipeline": 1, "resources.gpu.products": ["NVIDIA-GB200"]}
    )
    pool = plan_deployment(s, Inventory(nodes), 1).primary
    assert (pool.gpus_per_pod, pool.pods_per_replica, pool.nvlink_clique) == (4, 2, True)
    no_clique = [node(f"g{i}", "NVIDIA-GB200", 4, 189471, (10, 0)) for i in range(2)]
    with pytest.raises(PlanningError):
        plan_deployment(s, Inventory(no_clique), 1)


def test_pipeline_across_nodes_keeps_tp_inside_a_node() -> None:
    nodes = [node(f"h{i}", "NVIDIA-H100-80GB-HBM3", 8, 81559, (9, 0)) for i in range(2)]
    s = spec(**{"parallelism.tensor": 8, "parallelism.pipeline": 2})
    pool = plan_deployment(s, Inventory(nodes), 1).primary
    assert (pool.gpus_per_pod, pool.pods_per_replica, pool.nvlink_clique) == (8, 2, False)


def test_pools_ordered_overflow_and_weighted() -> None:
    inv = Inventory([node("h", "NVIDIA-H100-80GB-HBM3", 8, 81559, (9, 0)),
                     node("a", "NVIDIA-A100-SXM4-40GB", 8, 40960, (8, 0))])  # fmt: skip
    pools = [{"name": "h100", "products": ["NVIDIA-H100-80GB-HBM3"], "maxReplicas": 1, "weight": 1},
             {"name": "a100", "products": ["NVIDIA-A100-SXM4-40GB"], "weight": 3}]  # fmt: skip
    ordered = plan_deployment(spec(**{"resources.gpu.pools": pools}), inv, 2)
    assert [p.replicas for p in ordered.pools] == [1, 1]
    assert ordered.pools[0].sm == "sm90" and ordered.pools[1].sm == "sm80"
    pools[0].pop("maxReplicas")
    weighted = plan_deployment(
        spec(**{"resources.gpu.pools": pools, "resources.gpu.poolPolicy": "weighted"}), inv, 4
    )
    assert sum(p.replicas for p in weighted.pools) == 4


PRODUCT_CHOICES = [
    ("NVIDIA-H100-80GB-HBM3", 81559, (9, 0), 8),
    ("NVIDIA-A100-SXM4-40GB", 40960, (8, 0), 8),
    ("NVIDIA-L40S", 46068, (8, 9), 4),
    ("NVIDIA-A10G", 23028, (8, 6), 1),
]


@st.composite
def inventories(draw: st.DrawFn) -> Inventory:
    chosen = draw(st.lists(st.sampled_from(PRODUCT_CHOICES), min_size=1, max_size=4, unique=True))
    nodes = []
    for product, mem, cc, gpus in chosen:
        for i in range(draw(st.integers(1, 3))):
            nodes.append(node(f"{product}-{i}", product, gpus, mem, cc))
    return Inventory(nodes)


MODELS = ["meta-llama/Llama-2-7b-chat-hf", "meta-llama/Meta-Llama-3-8B-Instruct",
          "meta-llama/Llama-2-13b-chat-hf",
          "meta-llama/Meta-Llama-3-70B-Instruct"]  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(inv=inventories(), model=st.sampled_from(MODELS),
       precision=st.sampled_from(["fp16", "fp8", "int4-awq"]),
       batch=st.sampled_from([1, 8, 64]))  # fmt: skip
def test_planner_invariants_and_optimality(inv: Inventory, model: str, precision: str, batch: int) -> None:
    s = spec(**{"model.name": model, "engine.precision": precision, "engine.maxBatchSize": batch})
    optimum = brute_force_min_gpus(s, inv)  # every tp x pp x product tried (bench/planner.py)
    if optimum is None:
        with pytest.raises(PlanningError):
            plan_deployment(s, inv, 1)
        return
    pool = plan_deployment(s, inv, 1).primary
    arch = lookup(s.model)
    assert arch is not None
    assert pool.world_size == pool.tensor * pool.pipeline == pool.gpus_per_pod * pool.pods_per_replica
    assert arch.num_attention_heads % pool.tensor == 0 and arch.num_layers % pool.pipeline == 0
    assert memory.per_gpu(arch, s, pool.tensor, pool.pipeline, pool.gpu_memory_mib).fits
    if precision == "fp8":
        assert pool.compute_capability >= (8, 9)
    assert pool.world_size == optimum, "not the fewest GPUs"


def test_explicit_parallelism_must_shard_the_catalogued_model_evenly() -> None:
    s = spec(
        **{
            "parallelism.tensor": 16,
            "parallelism.pipeline": 1,
            "model.name": "meta-llama/Llama-2-13b-chat-hf",
        }
    )
    with pytest.raises(PlanningError) as err:
        plan_deployment(s, None, 1)
    assert err.value.reason == "InvalidParallelism"
    assert "40 attention heads" in err.value.message


def test_inventory_reports_only_changes_planning_reads() -> None:
    inv = Inventory()
    n = node("h", "NVIDIA-H100-80GB-HBM3", 8, 81559, (9, 0))
    assert inv.upsert(n) is True
    heartbeat = {**n, "status": {**n["status"], "images": [{"names": ["x"]}]}}
    assert inv.upsert(heartbeat) is False
    fewer = {**n, "status": {**n["status"], "allocatable": {"nvidia.com/gpu": "4"}}}
    assert inv.upsert(fewer) is True
    assert inv.nodes["h"].gpus == 4
    assert inv.upsert({"metadata": {"name": "cpu", "labels": {}}}) is False, "non-GPU nodes are not kept"
    assert inv.remove("h") is True and inv.remove("h") is False
