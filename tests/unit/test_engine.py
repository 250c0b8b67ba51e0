"""Engine cache key, build Job and build commands."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.engine import build_job, cache_key
from llm_operator.engine.build import MARKER, commands, main, parse
from llm_operator.plan.types import PoolPlan

H100 = PoolPlan("main", "NVIDIA-H100-80GB-HBM3", ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-SXM5-80GB"), (9, 0),
                81559, 4, 1, 4, 1, 1)  # fmt: skip


def spec(**engine: Any) -> LLMDeploymentSpec:
    return LLMDeploymentSpec.model_validate({
        "model": {"name": "meta-llama/Meta-Llama-3-70B-Instruct", "source": {"uri": "s3://m"},
                  "revision": "abc"},
        "engine": {"precision": "fp8", "build": {}, **engine},
    })  # fmt: skip


@pytest.mark.parametrize(
    "change",
    [{"precision": "bf16"}, {"maxBatchSize": 8}, {"maxInputLen": 1024}, {"maxSeqLen": 4096},
     {"maxNumTokens": 4096}, {"kvCacheDtype": "fp8"}, {"maxBeamWidth": 2}],
)  # fmt: skip
def test_cache_key_changes_with_every_engine_input(change: dict[str, Any]) -> None:
    assert cache_key(spec(**change), H100, "0.20.0") != cache_key(spec(), H100, "0.20.0")


def test_cache_key_tracks_parallelism_architecture_version_and_revision() -> None:
    base = cache_key(spec(), H100, "0.20.0")
    assert base == cache_key(spec(), H100, "0.20.0")
    assert cache_key(spec(), dataclasses.replace(H100, tensor=8), "0.20.0") != base
    assert cache_key(spec(), dataclasses.replace(H100, compute_capability=(10, 0)), "0.20.0") != base
    assert cache_key(spec(), H100, "0.21.0") != base
    other = spec().model_copy(update={"model": spec().model.model_copy(update={"revision": "def"})})
    assert cache_key(other, H100, "0.20.0") != base
    # Two products of one architecture share engines.
    assert cache_key(spec(), dataclasses.replace(H100, gpu_product="NVIDIA-H100-SXM5-80GB"), "0.20.0") == base
    assert base.startswith("meta-llama-3-70b-instruct-fp8-tp4pp1-sm90-")


def test_build_job_runs_on_the_serving_product_and_writes_to_the_cache() -> None:
    key = cache_key(spec(), H100, "0.20.0")
    job = build_job("llama", "ns", spec(), H100, key, image="builder:1", owner={"uid": "u"})
    pod = job["spec"]["template"]["spec"]
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]
    assert term["matchExpressions"][0]["values"] == list(H100.allowed_products)
    (c,) = pod["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert c["args"][c["args"].index("--output") + 1] == f"/engine-cache/engines/{key}"
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "llm-engine-cache"
    assert job["metadata"]["ownerReferences"] == [{"uid": "u"}]


def args(precision: str, sm: str = "sm90", kv: str = "auto") -> list[str]:
    return ["--model", "s3://m", "--revision", "r", "--precision", precision, "--kv-cache-dtype", kv,
            "--sm", sm,
            "--output", "/out", "--key", "k", "--tp", "2", "--pp", "1", "--max-batch-size", "8",
            "--max-input-len", "1024", "--max-seq-len", "2048", "--max-num-tokens", "2048",
            "--max-beam-width", "1"]  # fmt: skip


@pytest.mark.parametrize(
    ("precision", "qformat", "gemm"),
    [("fp16", None, "auto"), ("bf16", None, "auto"), ("fp8", "fp8", "disable"),
     ("int8-sq", "int8_sq", "auto"),
     ("int4-awq", "int4_awq", "auto"), ("w4a8-awq", "w4a8_awq", "disable")],
)  # fmt: skip
def test_build_commands_per_precision(precision: str, qformat: str | None, gemm: str) -> None:
    _, convert, build = commands(parse(args(precision)))
    if qformat is None:
        assert "convert_checkpoint.py" in convert[1] and "--qformat" not in convert
    else:
        assert convert[convert.index("--qformat") + 1] == qformat
    assert convert[convert.index("--tp_size") + 1] == "2"
    assert build[build.index("--gemm_plugin") + 1] == gemm
    assert ("--use_fp8_context_fmha" in build) == (precision in ("fp8", "w4a8-awq"))
    assert build[build.index("--max_seq_len") + 1] == "2048"


def test_fp8_context_fmha_only_on_hopper() -> None:
    _, _, build = commands(parse(args("fp8", sm="sm89")))
    assert "--use_fp8_context_fmha" not in build


def test_cached_engine_is_not_rebuilt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = args("fp16")
    argv[argv.index("/out")] = str(tmp_path)
    (tmp_path / MARKER).write_text("k\n")
    assert main(argv) == 0
    assert "nothing to build" in capsys.readouterr().out


def test_checkpoint_fetch_per_store() -> None:
    from llm_operator.engine.build import fetch_command

    assert fetch_command("s3://b/llama/", "r", "/m")[:3] == ["aws", "s3", "sync"]
    assert fetch_command("hf://meta-llama/Llama-2-7b-hf", "main", "/m")[2:5] == [
        "meta-llama/Llama-2-7b-hf", "--revision", "main",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="cannot fetch"):
        fetch_command("builtin://tiny-llama", "r", "/m")
