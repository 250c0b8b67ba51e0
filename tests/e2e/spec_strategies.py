"""Hypothesis strategies for LLMDeployment specs: mostly plausible, sometimes wrong.

Every field is drawn from values a user would write, and about one time in eight from a value
that is wrong in a way users get wrong (a parallel degree that is not a power of two, lengths that
do not fit, a reserved env name or label, an out-of-range number, a URI scheme we do not read).
GPU products include the test world's pools and one it lacks. So across a run the API server
refuses some specs, the planner refuses some with a reason, and the rest deploy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from hypothesis import strategies as st

T = TypeVar("T")
PRODUCTS = ("NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB", "NVIDIA-L40S", "NVIDIA-A10G", "NVIDIA-GB200")
UNKNOWN_PRODUCT = "NVIDIA-B300-SXM6-288GB"  # not in the test world's node pools
MODELS = (
    "meta-llama/Llama-3.2-1B-Instruct",
    "meta-llama/Meta-Llama-3-8B-Instruct",
    "meta-llama/Meta-Llama-3-70B-Instruct",
    "mistralai/Mixtral-8x7B-Instruct-v0.1",
    "acme/unknown-model",  # no architecture known to the planner
)


def mostly(good: Sequence[T], bad: Sequence[T]) -> st.SearchStrategy[T]:
    """A good value, or one time in eight a bad one (not at 0 or 7: Hypothesis favours the ends)."""
    return st.integers(0, 7).flatmap(lambda n: st.sampled_from(bad if n == 5 else good))


def sometimes(strategy: st.SearchStrategy[T]) -> st.SearchStrategy[T | None]:
    return st.one_of(st.none(), strategy)


uris = mostly(
    ["s3://models/m/", "hf://meta-llama/x", "pvc://engines/m"], ["ftp://x", "pvc://", "gs://bucket/m"]
)
degree = mostly([1, 2, 4, 8, "auto"], [3, 16, 64])


@st.composite
def engines(draw: st.DrawFn, cpu: bool) -> dict[str, Any]:
    input_len = draw(st.sampled_from([128, 1024, 4096]))
    engine: dict[str, Any] = {
        "precision": draw(
            mostly(["fp16", "bf16"], ["fp8"]) if cpu else mostly(["fp16", "bf16", "int4-awq"], ["fp8"])
        ),
        "maxBatchSize": draw(mostly([1, 8, 64], [5000])),
        "maxInputLen": input_len,
        "maxSeqLen": draw(mostly([input_len, 2 * input_len, 8 * input_len], [input_len // 2])),
        "maxNumTokens": draw(st.sampled_from([input_len, 4 * input_len])),
    }
    if cpu:
        engine["backend"] = "cpu-reference"
        return engine
    # Engines: named, or left to the default (pytorch), which refuses their fields by name.
    if draw(mostly([True], [False])):
        engine["backend"] = "tensorrt-engine"
    kv = draw(sometimes(mostly(["auto", "fp16", "int8"], ["fp8"])))
    if kv:
        engine["kvCacheDtype"] = kv
    if draw(st.booleans()):
        engine["prebuilt"] = {"uri": draw(mostly(["pvc://engines/prebuilt"], ["s3://engines/x"]))}
    else:
        engine["build"] = {"backoffLimit": draw(mostly([0, 1, 3], [11]))}
        dataset = draw(
            sometimes(mostly(["pvc://engines/calibration", "hf://abisee/cnn_dailymail"], ["s3://d/x"]))
        )
        if dataset:
            engine["build"]["calibration"] = {"datasetUri": dataset}
        engine["cache"] = {"uri": draw(mostly(["pvc://engines/cache"], ["s3://cache/"]))}
    return engine


@st.composite
def runtimes(draw: st.DrawFn) -> dict[str, Any]:
    runtime: dict[str, Any] = {}
    if draw(st.booleans()):
        runtime["profile"] = draw(st.sampled_from(["latency", "throughput", "balanced"]))
    if draw(st.booleans()):
        runtime["env"] = [{"name": draw(mostly(["HF_TOKEN", "NCCL_DEBUG"], ["LLMOP_ROLE"])), "value": "x"}]
    if draw(st.booleans()):
        key = draw(
            mostly(["team", "example.com/cost-center"], ["llmoperator.io/x", "app.kubernetes.io/name"])
        )
        runtime["podLabels"] = {key: "a"}
    if draw(st.booleans()):
        runtime["batching"] = {"maxQueueDelayMicroseconds": draw(mostly([0, 100, 5000], [20_000_000]))}
    if draw(st.booleans()):
        runtime["startupTimeoutSeconds"] = draw(mostly([60, 600], [30]))
    return runtime


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    cpu = draw(st.integers(0, 3)) == 0
    uri = draw(mostly(["builtin://tiny-llama"], ["s3://models/m/"]) if cpu else uris)
    spec: dict[str, Any] = {
        "model": {"name": draw(st.sampled_from(MODELS)), "source": {"uri": uri}},
        "engine": draw(engines(cpu)),
    }
    if not cpu and uri.startswith(("s3://", "hf://")) and draw(mostly([True], [False])):
        spec["model"]["cache"] = {"claimName": "llm-model-cache"}  # required: refused without it
    if cpu:
        spec["resources"] = {"cpu": "100m"}  # its pods really run: the real node has 2 CPUs in all
        if draw(st.integers(0, 7)) == 5:
            spec["parallelism"] = {"tensor": 2}  # refused: the CPU model runs on one process
    else:
        products = draw(st.lists(mostly(PRODUCTS, [UNKNOWN_PRODUCT]), min_size=1, max_size=2, unique=True))
        spec["resources"] = {"gpu": {"products": products}}
        if draw(st.booleans()):
            spec["parallelism"] = {"tensor": draw(degree), "pipeline": draw(mostly([1, 2], [4, 8]))}
    if draw(st.booleans()):
        spec["replicas"] = draw(st.integers(0, 3))
    if draw(st.integers(0, 3)) == 0:
        low = draw(st.integers(1, 3))
        spec["autoscaling"] = {"minReplicas": low, "maxReplicas": draw(mostly([low, low + 2], [low - 1]))}
    runtime = draw(runtimes())
    if runtime:
        spec["runtime"] = runtime
    return spec
