"""Rendered Triton configs parse with Triton's own schema, and spec values reach the parameters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import text_format
from llm_operator.api.v1alpha1 import LLMDeploymentSpec, Profile
from llm_operator.modelrepo import render_repository, to_configmap_data
from llm_operator.plan.cpu import cpu_plan
from llm_operator.plan.types import PoolPlan
from llm_operator.profiles import PROFILES
from llm_operator.runtime.repository import materialize
from tritonclient.grpc import model_config_pb2

POOL = PoolPlan("main", "NVIDIA-H100-80GB-HBM3", ("NVIDIA-H100-80GB-HBM3",), (9, 0), 81559, 4, 1, 4, 1, 1)


def spec(backend: str = "tensorrt-engine", **runtime: Any) -> LLMDeploymentSpec:
    """cpu-reference on the ensemble contract: these tests hold the ensemble's repository (the
    llmapi one's: the cpu-reference goldens, tests/triton/test_cpu_llmapi.py)."""
    cpu = backend == "cpu-reference"
    contract = {"cpuReference": {"contract": "tensorrt-engine"}} if cpu else {}
    return LLMDeploymentSpec.model_validate({
        "model": {"name": "m", "source": {"uri": "builtin://tiny-llama" if cpu else "pvc://models/m"}},
        "engine": {"backend": backend, "maxBatchSize": 32, **contract},
        "runtime": runtime,
    })  # fmt: skip


def parse(files: dict[str, str]) -> dict[str, model_config_pb2.ModelConfig]:
    """Strict parse of every config.pbtxt: an unknown field or a wrong type raises."""
    return {
        path: text_format.Parse(text, model_config_pb2.ModelConfig())
        for path, text in files.items()
        if path.endswith("/config.pbtxt")
    }


def params(cfg: model_config_pb2.ModelConfig) -> dict[str, str]:
    return {k: v.string_value for k, v in cfg.parameters.items()}


@pytest.mark.parametrize("profile", list(Profile))
@pytest.mark.parametrize("backend", ["tensorrt-engine", "cpu-reference"])
def test_every_profile_and_backend_parses(profile: Profile, backend: str) -> None:
    s = spec(backend, profile=profile.value)
    pool = cpu_plan(s).primary if backend == "cpu-reference" else POOL
    configs = parse(render_repository(s, pool, engine_dir="/engines/k", tokenizer_dir="/engines/k/tokenizer"))
    # The CPU runtime's engine contract: tensorrt_llm (ids) beside its text ensemble.
    expected = {"tensorrt_llm/config.pbtxt", "ensemble/config.pbtxt"} if backend == "cpu-reference" else {
        "preprocessing/config.pbtxt", "tensorrt_llm/config.pbtxt", "postprocessing/config.pbtxt",
        "ensemble/config.pbtxt",
    }  # fmt: skip
    assert set(configs) == expected
    for cfg in configs.values():
        assert cfg.max_batch_size == 32
    if backend == "tensorrt-engine":
        trt = configs["tensorrt_llm/config.pbtxt"]
        p = params(trt)
        defaults = PROFILES[profile]
        assert trt.dynamic_batching.max_queue_delay_microseconds == defaults.max_queue_delay_microseconds
        assert float(p["kv_cache_free_gpu_mem_fraction"]) == defaults.kv_cache_free_gpu_memory_percent / 100
        assert p["gpt_model_path"] == "/engines/k"
        assert p["gpu_device_ids"] == "0,1,2,3"
        assert "${" not in str(trt), "every placeholder must be filled"


def test_spec_values_override_profile_defaults() -> None:
    s = spec(
        profile="throughput", streaming=False, chunkedContext=False, excludeInputInOutput=False,
        batching={"strategy": "inflight", "maxQueueDelayMicroseconds": 123, "maxQueueSize": 7,
                  "schedulerPolicy": "guaranteed-no-evict"},
        kvCache={"freeGpuMemoryPercent": 42, "maxTokens": 9000, "blockReuse": False},
    )  # fmt: skip
    trt = parse(render_repository(s, POOL, engine_dir="/e", tokenizer_dir="/t"))["tensorrt_llm/config.pbtxt"]
    p = params(trt)
    assert trt.model_transaction_policy.decoupled is False
    assert trt.dynamic_batching.max_queue_delay_microseconds == 123
    assert trt.dynamic_batching.default_queue_policy.max_queue_size == 7
    assert p["gpt_model_type"] == "inflight_batching"
    assert p["batch_scheduler_policy"] == "guaranteed_no_evict"
    assert p["kv_cache_free_gpu_mem_fraction"] == "0.42"
    assert p["max_tokens_in_paged_kv_cache"] == "9000"
    assert (p["enable_kv_cache_reuse"], p["enable_chunked_context"], p["exclude_input_in_output"]) == (
        "false", "false", "false",
    )  # fmt: skip


@pytest.mark.parametrize("profile", list(Profile))
def test_only_the_engine_queue_is_bounded_by_default(profile: Profile) -> None:
    """A queue bound turns off Triton's batcher prefetch (docs/runtime.md "Queue bounds"): the
    profile's bound goes to tensorrt_llm, which TensorRT-LLM's executor enforces, and nowhere a
    blocking python model would then wait for the batcher's 500 ms timer."""
    trt = parse(render_repository(spec(profile=profile), POOL, engine_dir="/e", tokenizer_dir="/t"))
    bounds = {path: c.dynamic_batching.default_queue_policy.max_queue_size for path, c in trt.items()
              if c.HasField("dynamic_batching")}  # fmt: skip
    assert bounds == {"tensorrt_llm/config.pbtxt": PROFILES[profile].max_queue_size,
                      "preprocessing/config.pbtxt": 0, "postprocessing/config.pbtxt": 0}  # fmt: skip
    cpu = spec("cpu-reference", profile=profile)
    cfg = parse(render_repository(cpu, cpu_plan(cpu).primary, engine_dir="", tokenizer_dir=""))
    assert {c.dynamic_batching.default_queue_policy.max_queue_size for c in cfg.values()} == {0}
    bounded = spec("cpu-reference", profile=profile, batching={"maxQueueSize": 5})
    cfg = parse(render_repository(bounded, cpu_plan(bounded).primary, engine_dir="", tokenizer_dir=""))
    assert {path: c.dynamic_batching.default_queue_policy.max_queue_size for path, c in cfg.items()} == {
        "tensorrt_llm/config.pbtxt": 5, "ensemble/config.pbtxt": 5}  # fmt: skip


def test_configmap_round_trip_builds_a_loadable_layout(tmp_path: Path) -> None:
    files = render_repository(spec(), POOL, engine_dir="/e", tokenizer_dir="/t")
    data = to_configmap_data(files)
    assert all(set(k) <= set("abcdefghijklmnopqrstuvwxyz_.-0123456789") for k in data)
    src = tmp_path / "cm"
    src.mkdir()
    for key, text in data.items():
        (src / key).write_text(text)
    model_py = tmp_path / "model.py"
    model_py.write_text("# python model\n")
    materialize(src, tmp_path / "repo", {"preprocessing/1/model.py": model_py})
    for path, text in files.items():
        assert (tmp_path / "repo" / path).read_text() == text
        assert (tmp_path / "repo" / path).parent.joinpath("1").is_dir()
    assert (tmp_path / "repo/preprocessing/1/model.py").read_text() == "# python model\n"


def test_model_repo_command_writes_a_loadable_repository(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from llm_operator.cli import main

    example = Path(__file__).resolve().parents[2] / "examples" / "llama3-70b-fp8.yaml"
    assert main(["model-repo", "-f", str(example), "-o", str(tmp_path)]) == 0
    # What it cannot write (NVIDIA's model.py) it names, with where serving pods take it from.
    said = capsys.readouterr().err
    for model in ("preprocessing", "postprocessing"):
        assert not (tmp_path / model / "1" / "model.py").exists()
        assert f"not written: {model}/1/model.py: copy it from /app/all_models/inflight_batcher_llm/" in said
    configs = parse(
        {p.relative_to(tmp_path).as_posix(): p.read_text() for p in tmp_path.glob("*/config.pbtxt")}
    )
    assert set(configs) == {
        f"{m}/config.pbtxt" for m in ("preprocessing", "tensorrt_llm", "postprocessing", "ensemble")
    }
    assert all(
        (tmp_path / m / "1").is_dir() for m in ("preprocessing", "tensorrt_llm", "postprocessing", "ensemble")
    )


@pytest.mark.parametrize("example", ["llama31-8b-pytorch.yaml", "cpu-reference.yaml"])
def test_model_repo_command_writes_what_render_puts_in_the_configmap(
    example: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The pytorch backend's model.yaml names the checkpoint where the serving pod mounts its
    pvc:// source (the command used to refuse it: no model directory)."""
    from llm_operator.cli import main

    path = Path(__file__).resolve().parents[2] / "examples" / example
    assert main(["model-repo", "-f", str(path), "-o", str(tmp_path)]) == 0
    written = {p.relative_to(tmp_path).as_posix(): p.read_text() for p in tmp_path.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(["render", "-f", str(path)]) == 0
    rendered = [o for o in yaml.safe_load_all(capsys.readouterr().out) if o["kind"] == "ConfigMap"]
    (configmap,) = [c for c in rendered if "-model-repo-" in c["metadata"]["name"]]
    assert to_configmap_data(written) == configmap["data"]


def test_a_cached_cpu_reference_model_names_no_builtin_weights() -> None:
    """A cpu-reference repository for a cached source names no builtin model: model.py then loads
    the checkpoint in LLMOP_MODEL_DIR (and refuses to start without one)."""
    builtin = spec("cpu-reference")
    source = builtin.model.source.model_copy(update={"uri": "s3://models/tiny-llama"})
    cached = builtin.model_copy(update={"model": builtin.model.model_copy(update={"source": source})})
    pool = cpu_plan(builtin).primary
    for model in ("ensemble", "tensorrt_llm"):
        rendered = {
            s.model.source.uri: params(
                parse(render_repository(s, pool, engine_dir="", tokenizer_dir=""))[f"{model}/config.pbtxt"]
            )
            for s in (builtin, cached)
        }
        assert rendered["builtin://tiny-llama"]["model"] == "tiny-llama", model
        assert rendered["s3://models/tiny-llama"]["model"] == "", model


def test_the_cpu_engine_contract_has_one_decoder() -> None:
    """tensorrt_llm is the CPU decoder (model.py, with the weights' parameters and the TTFT
    buckets); the ensemble is the BLS model around it (ensemble.py), told only whose tokenizer to
    load and the echo default."""
    s = spec("cpu-reference")
    files = render_repository(s, cpu_plan(s).primary, engine_dir="", tokenizer_dir="")
    assert set(files) == {
        f"{m}/{f}" for m in ("tensorrt_llm", "ensemble") for f in ("config.pbtxt", "1/model.py")
    }
    assert (
        "model_name=ENGINE" in files["ensemble/1/model.py"]
        and "served.load" not in files["ensemble/1/model.py"]
    )
    assert "served.load" in files["tensorrt_llm/1/model.py"]
    configs = parse(files)
    assert set(params(configs["tensorrt_llm/config.pbtxt"])) >= {"weights_seed", "ttft_buckets_ms", "model"}
    assert set(params(configs["ensemble/config.pbtxt"])) == {
        "python_path",
        "model",
        "exclude_input_in_output",
    }
