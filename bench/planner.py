"""Planner benchmark: plan time at 1,000 nodes, and GPUs used against the brute-force optimum."""

from __future__ import annotations

import json
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.plan import memory
from llm_operator.plan.catalogue import lookup
from llm_operator.plan.inventory import Inventory
from llm_operator.plan.planner import ProductView, layout, plan_deployment
from llm_operator.plan.types import PlanningError

PRODUCTS = [
    ("NVIDIA-H100-80GB-HBM3", 81559, (9, 0), 8),
    ("NVIDIA-A100-SXM4-40GB", 40960, (8, 0), 8),
    ("NVIDIA-L40S", 46068, (8, 9), 4),
    ("NVIDIA-A10G", 23028, (8, 6), 1),
]
MODELS = ["meta-llama/Llama-2-7b-chat-hf", "meta-llama/Meta-Llama-3-8B-Instruct",
          "meta-llama/Llama-2-13b-chat-hf",
          "meta-llama/Meta-Llama-3-70B-Instruct"]  # fmt: skip


def nodes(count: int, rng: random.Random) -> list[dict[str, Any]]:
    out = []
    for i in range(count):
        product, mem, cc, gpus = rng.choice(PRODUCTS)
        out.append({
            "metadata": {"name": f"n{i}", "labels": {
                "nvidia.com/gpu.product": product, "nvidia.com/gpu.memory": str(mem),
                "nvidia.com/gpu.compute.major": str(cc[0]), "nvidia.com/gpu.compute.minor": str(cc[1]),
                "topology.kubernetes.io/zone": f"z{i % 3}"}},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}},
        })  # fmt: skip
    return out


def spec(model: str, precision: str, batch: int) -> LLMDeploymentSpec:
    return LLMDeploymentSpec.model_validate({
        "model": {"name": model, "source": {"uri": "s3://m"}},
        "engine": {"precision": precision, "maxBatchSize": batch, "maxInputLen": 2048, "maxSeqLen": 4096,
                   "maxNumTokens": 4096},
        "parallelism": {"tensor": "auto", "pipeline": "auto"},
    })  # fmt: skip


def optimum(s: LLMDeploymentSpec, inv: Inventory) -> int | None:
    arch = lookup(s.model)
    assert arch is not None
    best = None
    for product in inv.products():
        view = ProductView.of(product, inv)
        if view is None or (s.engine.precision.value == "fp8" and view.compute_capability < (8, 9)):
            continue
        for tp in (1, 2, 4, 8, 16, 32, 64):
            for pp in (1, 2, 4, 8, 16, 32, 64):
                if tp * pp > 64 or arch.num_attention_heads % tp or arch.num_layers % pp:
                    continue
                if (
                    not isinstance(layout(tp, pp, view), str)
                    and memory.per_gpu(arch, s, tp, pp, view.memory_mib).fits
                ):
                    best = tp * pp if best is None else min(best, tp * pp)
    return best


def node_object_bytes(node: dict[str, Any]) -> int:
    """A realistic Node object: labels plus the status a kubelet reports (images dominate)."""
    padded = {**node, "status": {**node["status"], "images": [{"names": [f"registry/img-{i}:tag"],
              "sizeBytes": 1 << 30} for i in range(50)]}}  # fmt: skip
    return len(json.dumps(padded))


def run(print_fn: Callable[[str], None] = print) -> None:
    rng = random.Random(7)
    objects = nodes(1000, rng)
    tracemalloc.start()
    start = time.perf_counter()
    inv = Inventory(objects)
    build_ms = (time.perf_counter() - start) * 1000
    kept = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    start = time.perf_counter()
    for obj in objects[:100]:
        inv.upsert(obj)  # a status update that changes nothing planning reads
    update_us = (time.perf_counter() - start) * 1e6 / 100
    watched = sum(node_object_bytes(o) for o in objects)
    print_fn(
        f"planner bench: inventory of 1,000 nodes built in {build_ms:.1f} ms, keeps {kept / 1024:.0f} KiB "
        f"(the Node objects it reads are ~{watched / 1024 / 1024:.1f} MiB of JSON); a Node update that "
        f"changes nothing it reads costs {update_us:.0f} us"
    )
    s = spec("meta-llama/Meta-Llama-3-70B-Instruct", "fp16", 16)
    times = []
    for _ in range(200):
        start = time.perf_counter()
        plan_deployment(s, inv, 4)
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    print_fn(
        f"planner bench: plan at 1,000 nodes: median {statistics.median(times):.2f} ms, "
        f"p95 {times[int(len(times) * 0.95)]:.2f} ms (goal <= 10 ms)"
    )
    used = best = 0
    cases = 0
    for _ in range(300):
        inv = Inventory(nodes(rng.randint(1, 12), rng))
        s = spec(rng.choice(MODELS), rng.choice(["fp16", "fp8", "int4-awq"]), rng.choice([1, 8, 64]))
        opt = optimum(s, inv)
        try:
            plan = plan_deployment(s, inv, 1)
        except PlanningError:
            continue
        if opt is not None:
            used += plan.primary.world_size
            best += opt
            cases += 1
    ratio = used / best
    label = f"planner bench: GPUs used / brute-force optimum over {cases} random cases"
    print_fn(f"{label} = {ratio:.2f} (goal 1.00)")
