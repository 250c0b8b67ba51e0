"""Planner benchmark: plan time at 1,000 nodes, and GPUs used against a brute-force optimum.

The oracle (`optimum`) shares only the memory model and the precision table with the planner: it
tries every product, tp, pp and pod size over the raw node records, so a layout the planner's
greedy search misses shows up as a ratio above 1.00 or as a missed plan. tests/unit/test_planner.py
runs the same oracle on fewer cases.
"""

from __future__ import annotations

import random
import statistics
import time
import tracemalloc
from collections.abc import Callable, Iterable
from typing import Any

from llm_operator import labels as L
from llm_operator.api.v1alpha1 import MAX_WORLD_SIZE, POWERS_OF_TWO, LLMDeploymentSpec
from llm_operator.plan import catalogue, gpus, memory
from llm_operator.plan.inventory import GpuNode, Inventory, tolerates
from llm_operator.plan.planner import MIN_COMPUTE, MIN_KV_COMPUTE, plan_deployment
from llm_operator.plan.types import Plan, PlanningError

PRODUCTS = ["NVIDIA-GB200", "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB", "NVIDIA-L40S", "NVIDIA-A10G"]
MODELS = [
    "meta-llama/Llama-2-7b-chat-hf",
    "meta-llama/Meta-Llama-3-8B-Instruct",
    "meta-llama/Llama-2-13b-chat-hf",
    "Qwen/Qwen2.5-32B-Instruct",
    "meta-llama/Meta-Llama-3-70B-Instruct",
    "meta-llama/Llama-3.1-405B-Instruct",
]
BLOCK_LABEL = "topology.k8s.aws/network-node-layer-3"


def random_nodes(rng: random.Random, count: int, products: list[str] = PRODUCTS) -> list[dict[str, Any]]:
    """Node objects as the API returns them: GFD labels, zones, blocks, GB200 cliques, and some
    nodes that cannot take pods (NotReady, cordoned, tainted, GPUs missing from allocatable)."""
    nodes = []
    for i in range(count):
        gpu = gpus.PRODUCTS[rng.choice(products)]
        present = gpu.gpus_per_node if rng.random() < 0.8 else rng.choice([1, 2, 4, 8])
        allocatable = present if rng.random() < 0.9 else rng.randint(0, present)
        labels = {
            "nvidia.com/gpu.product": gpu.name,
            "nvidia.com/gpu.count": str(present),
            "nvidia.com/gpu.memory": str(gpu.memory_mib),
            "nvidia.com/gpu.compute.major": str(gpu.compute_capability[0]),
            "nvidia.com/gpu.compute.minor": str(gpu.compute_capability[1]),
            "topology.kubernetes.io/zone": f"z{rng.randint(0, 2)}",
            BLOCK_LABEL: f"b{rng.randint(0, 3)}",
        }
        if gpu.nvlink_domain_gpus:
            labels["nvidia.com/gpu.clique"] = f"fabric.{rng.randint(0, 2)}"
        taints = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
        if rng.random() < 0.05:
            taints.append({"key": "maintenance", "effect": "NoExecute"})
        nodes.append(
            {
                "metadata": {"name": f"n{i}", "labels": labels},
                "spec": {"taints": taints, "unschedulable": rng.random() < 0.05},
                "status": {
                    "allocatable": {"cpu": "96", "nvidia.com/gpu": str(allocatable)},
                    "conditions": [{"type": "Ready", "status": "True" if rng.random() < 0.95 else "False"}],
                },
            }
        )
    return nodes


def random_spec(rng: random.Random, products: list[str] | None = None) -> LLMDeploymentSpec:
    precision = rng.choice(["fp16", "bf16", "fp8", "int4-awq"])
    doc: dict[str, Any] = {
        "model": {"name": rng.choice(MODELS), "source": {"uri": "pvc://models/x"}},
        "engine": {
            "backend": "tensorrt-engine",
            "precision": precision,
            "kvCacheDtype": rng.choice(["auto", "fp8"]) if precision == "fp8" else "auto",
            "maxBatchSize": rng.choice([1, 8, 64, 256]),
            "maxInputLen": 2048,
            "maxSeqLen": rng.choice([2048, 8192, 32768]),
            "maxNumTokens": 8192,
            "build": {"calibration": {"datasetUri": "pvc://calibration/text"}},
        },
        "parallelism": {"tensor": "auto", "pipeline": "auto"},
        "placement": {
            "pipelineParallelDomain": rng.choice(["network-block", "zone", "any"]),
            "pipelineParallelStrictness": rng.choice(["required", "preferred"]),
        },
    }
    if products:
        doc["resources"] = {"gpu": {"products": products}}
    doc["placement"]["tensorParallelDomain"] = rng.choice(["nvlink", "node"])
    return LLMDeploymentSpec.model_validate(doc)


def _domain(node: GpuNode, by: str) -> str | None:
    return {"block": node.block, "zone": node.zone, "clique": node.clique}.get(by, "")


def _holds(nodes: list[GpuNode], spec: LLMDeploymentSpec, nvlink: bool, tp: int, pp: int) -> bool:
    """Whether some placement of tp x pp ranks on these nodes satisfies the rules: one pod; or
    pods of whole TP groups across nodes of one domain (PP); or TP across nodes of one clique, where
    tensorParallelDomain nvlink allows it."""
    world = tp * pp
    tp_across = nvlink and spec.placement.tensor_parallel_domain == "nvlink"
    strict = spec.placement.pipeline_parallel_strictness == "required"
    pp_domain = {"network-block": "block", "zone": "zone"}.get(spec.placement.pipeline_parallel_domain, "any")
    for g in (p for p in POWERS_OF_TWO if p <= world):
        pods, big = world // g, [n for n in nodes if n.gpus >= g]
        if pods == 1 and big:
            return True
        if pods == 1 or (g % tp and not tp_across):
            continue
        by = "clique" if g % tp else pp_domain if strict else "any"
        counts: dict[str | None, int] = {}
        for n in big:
            counts[_domain(n, by)] = counts.get(_domain(n, by), 0) + 1
        if any(c >= pods for d, c in counts.items() if d is not None):
            return True
    return False


def optimum(spec: LLMDeploymentSpec, inventory: Inventory) -> tuple[bool, int] | None:
    """(short of the KV target, GPUs per replica) of the best plan that exists, by brute force:
    full-batch fits before partial ones, then fewest GPUs. None when nothing serves."""
    arch = catalogue.lookup(spec.model)
    assert arch is not None
    tolerations = [L.GPU_TOLERATION, *spec.placement.tolerations]
    by_product: dict[str, list[GpuNode]] = {}
    for n in inventory.nodes.values():
        if (
            n.ready
            and not n.unschedulable
            and n.gpus > 0
            and all(tolerates(tolerations, t) for t in n.taints)
        ):
            by_product.setdefault(n.product, []).append(n)
    wanted = spec.resources.gpu.products or list(by_product)
    kv_need = MIN_KV_COMPUTE.get(spec.engine.kv_cache_dtype, (0, 0))
    best: tuple[bool, int] | None = None
    for product in wanted:
        nodes = by_product.get(product, [])
        if not nodes:
            continue
        cc, mem = min(n.compute_capability for n in nodes), min(n.memory_mib for n in nodes)
        if cc < MIN_COMPUTE[spec.engine.precision] or cc < kv_need:
            continue
        known = gpus.lookup(product)
        for tp in (t for t in POWERS_OF_TWO if arch.num_attention_heads % t == 0):
            for pp in (p for p in POWERS_OF_TWO if arch.num_layers % p == 0 and tp * p <= MAX_WORLD_SIZE):
                fit = memory.fits(arch, spec, tp, pp, mem)
                if fit.serves and _holds(nodes, spec, known is None or known.nvlink, tp, pp):
                    found = (not fit.fits, tp * pp)
                    best = found if best is None else min(best, found)
    return best


def _timed(fn: Callable[[], object], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return sorted(times)


def _stats(times: list[float]) -> str:
    return f"median {statistics.median(times):.2f} ms, p95 {times[int(len(times) * 0.95)]:.2f} ms"


def compare(cases: Iterable[tuple[LLMDeploymentSpec, Inventory]]) -> tuple[int, int, int, int]:
    """(GPUs the planner used, GPUs of the optimum, cases compared, cases where the planner and
    the oracle disagree on whether a plan exists)."""
    used = best = compared = missed = 0
    for spec, inventory in cases:
        opt = optimum(spec, inventory)
        try:
            plan: Plan | None = plan_deployment(spec, inventory, 1)
        except PlanningError:
            plan = None
        if (plan is None) != (opt is None):
            missed += 1
        elif plan is not None and opt is not None:
            used += plan.primary.world_size
            best += opt[1]
            compared += 1
    return used, best, compared, missed


def run(print_fn: Callable[[str], None] = print) -> None:
    rng = random.Random(7)
    objects = random_nodes(rng, 1000)
    build_ms = statistics.median(_timed(lambda: Inventory(objects), 5))
    tracemalloc.start()
    inventory = Inventory(objects)
    kept = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    unchanged_us = _timed(lambda: [inventory.upsert(o) for o in objects[:100]], 5)[2] * 10
    print_fn(
        f"planner bench: inventory of 1,000 GPU nodes built in {build_ms:.1f} ms, keeps "
        f"{kept / 1024:.0f} KiB; a Node update that changes nothing it reads costs {unchanged_us:.0f} us"
    )
    spec = LLMDeploymentSpec.model_validate(
        {
            "model": {"name": "meta-llama/Meta-Llama-3-70B-Instruct", "source": {"uri": "pvc://models/x"}},
            "parallelism": {"tensor": "auto", "pipeline": "auto"},
        }
    )
    warm = _timed(lambda: plan_deployment(spec, inventory, 4), 200)

    def after_a_node_change() -> None:
        objects[0]["status"]["allocatable"]["nvidia.com/gpu"] = str(rng.randint(1, 4))
        inventory.upsert(objects[0])
        plan_deployment(spec, inventory, 4)

    cold = _timed(after_a_node_change, 50)
    print_fn(
        f"planner bench: plan Llama-3-70B (auto, any product) at 1,000 nodes: {_stats(warm)}; right after "
        f"a Node change (aggregates rebuilt): {_stats(cold)} (goal <= 10 ms)"
    )
    cases = []
    for _ in range(400):
        products = rng.sample(PRODUCTS, rng.randint(1, 3)) if rng.random() < 0.5 else None
        cases.append((random_spec(rng, products), Inventory(random_nodes(rng, rng.randint(1, 24)))))
    used, best, compared, missed = compare(cases)
    print_fn(
        f"planner bench: GPUs used / brute-force optimum over {compared} random cases = {used / best:.2f} "
        f"(goal 1.00); feasibility disagreements: {missed} of {len(cases)} (goal 0)"
    )
