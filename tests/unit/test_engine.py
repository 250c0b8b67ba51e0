"""Engine cache key, build Job (golden files under tests/golden/engine/) and build commands."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.engine import build as b
from llm_operator.engine import build_job, cache_key, engine_uri, key_label
from llm_operator.images import Images
from llm_operator.plan.types import PoolPlan
from llm_operator.storage import cached_model

from tests.golden_files import assert_golden

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "engine"
H100 = PoolPlan("main", "NVIDIA-H100-80GB-HBM3", ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-SXM5-80GB"), (9, 0),
                81559, 4, 1, 4, 1, 1)  # fmt: skip
A100 = PoolPlan("main", "NVIDIA-A100-SXM4-80GB", ("NVIDIA-A100-SXM4-80GB",), (8, 0), 81920, 4, 1, 4, 1, 1)
MULTI = dataclasses.replace(H100, tensor=8, pipeline=2, gpus_per_pod=8, pods_per_replica=2)
IMAGES = Images("runtime", "cpu-runtime", "", "1.1.0", launcher="launcher:1", fetch="fetch:1")
OWNER = {"apiVersion": "llmoperator.io/v1alpha1", "kind": "LLMDeployment", "name": "llama", "uid": "u-1",
         "controller": True, "blockOwnerDeletion": True}  # fmt: skip


def spec(model: dict[str, Any] | None = None, **engine: Any) -> LLMDeploymentSpec:
    return LLMDeploymentSpec.model_validate({
        "model": {"name": "meta-llama/Meta-Llama-3-70B-Instruct", "source": {"uri": "pvc://models/m"},
                  **(model or {})},
        "engine": {"backend": "tensorrt-engine", "precision": "fp8", "kvCacheDtype": "fp8",
                   "build": {"calibration": {"datasetUri": "pvc://calibration/cnn_dailymail"}}, **engine},
    })  # fmt: skip


# --- cache key --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [{"precision": "bf16"}, {"maxBatchSize": 8}, {"maxInputLen": 1024}, {"maxSeqLen": 4096},
     {"maxNumTokens": 4096}, {"kvCacheDtype": "auto"}, {"maxBeamWidth": 2}],
)  # fmt: skip
def test_cache_key_changes_with_every_engine_input(change: dict[str, Any]) -> None:
    assert cache_key(spec(**change), H100, "0.20.0") != cache_key(spec(), H100, "0.20.0")


def test_cache_key_tracks_model_parallelism_architecture_and_version() -> None:
    base = cache_key(spec(), H100, "0.20.0")
    assert base == cache_key(spec(), H100, "0.20.0"), "stable"
    assert base.startswith("meta-llama-3-70b-instruct-fp8-tp4pp1-sm90-")
    # The cached model's resolved revision: new weights are a new engine.
    assert cache_key(spec(), H100, "0.20.0", "etags-1") != cache_key(spec(), H100, "0.20.0", "etags-2")
    assert cache_key(spec({"name": "meta-llama/Llama-3.1-70B"}), H100, "0.20.0") != base
    assert cache_key(spec(), dataclasses.replace(H100, tensor=8), "0.20.0") != base
    assert cache_key(spec(), dataclasses.replace(H100, tensor=2, pipeline=2), "0.20.0") != base
    assert cache_key(spec(), H100, "0.21.0") != base
    # Another GPU generation needs its own engine ...
    assert cache_key(spec(precision="fp16", kvCacheDtype="auto"), A100, "0.20.0") != cache_key(
        spec(precision="fp16", kvCacheDtype="auto"), H100, "0.20.0"
    )
    assert cache_key(spec(), dataclasses.replace(H100, compute_capability=(10, 0)), "0.20.0") != base
    # ... two products of one architecture share it, as do pools that differ only in replicas.
    sxm5 = dataclasses.replace(H100, name="b", gpu_product="NVIDIA-H100-SXM5-80GB", gpu_memory_mib=81920)
    assert cache_key(spec(), sxm5, "0.20.0") == base
    assert cache_key(spec(), dataclasses.replace(H100, replicas=7), "0.20.0") == base


def test_cache_key_of_a_multi_node_world_includes_the_gpus_per_pod() -> None:
    four = dataclasses.replace(MULTI, gpus_per_pod=4, pods_per_replica=4)
    assert cache_key(spec(), MULTI, "0.20.0") != cache_key(spec(), four, "0.20.0")


def test_key_label_is_a_valid_label_value_keeping_the_hash() -> None:
    key = cache_key(spec({"name": "org/" + "a-very-long-model-name-" * 4}), H100, "0.20.0")
    label = key_label(key)
    assert len(label) <= 63 and re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", label)
    assert label.endswith(key[-12:])


def test_engine_uri_is_one_directory_per_key_or_the_prebuilt_one() -> None:
    assert engine_uri(spec(), "k1") == "pvc://llm-engine-cache/engines/k1"
    prebuilt = LLMDeploymentSpec.model_validate({
        "model": {"name": "m", "source": {"uri": "pvc://models/m"}},
        "engine": {"backend": "tensorrt-engine", "prebuilt": {"uri": "pvc://c/llama/tp4"}},
    })  # fmt: skip
    assert engine_uri(prebuilt, None) == "pvc://c/llama/tp4"


# --- build Job --------------------------------------------------------------------------------

JOBS = {
    # Single node, checkpoint fetched from S3 into the model cache, engine cache on a PVC.
    "fp8-tp4-pvc-cache": (
        spec({"source": {"uri": "s3://m", "credentialsSecretRef": {"name": "s3-reader"}},
              "cache": {"claimName": "llm-model-cache"}}),
        H100,
    ),
    # Two 8-GPU pods per replica, checkpoint on a PVC, engine cache in S3, user placement.
    "fp16-tp8pp2-s3-cache": (
        LLMDeploymentSpec.model_validate({
            "model": {"name": "meta-llama/Llama-3.1-405B", "source": {"uri": "pvc://models/llama-405b"}},
            "engine": {"backend": "tensorrt-engine", "precision": "fp16", "cache": {"uri": "s3://engines/llm"},
                       "build": {"activeDeadlineSeconds": 28800, "backoffLimit": 2}},
            "placement": {"nodeSelector": {"pool": "gpu"}, "priorityClassName": "batch",
                          "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm",
                                           "effect": "NoSchedule"}]},
        }),
        MULTI,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(JOBS))
def test_build_job_matches_golden_and_validates(name: str) -> None:
    s, pool = JOBS[name]
    model = (
        cached_model("llm-model-cache", "models/s3-0123456789abcdef/etags-fedcba9876543210")
        if s.model.cache
        else None
    )
    job = build_job("llama", "team-a", s, pool, cache_key(s, pool, "0.20.0"), image="builder:0.20.0",
                    images=IMAGES, owner=OWNER, trtllm_version="0.20.0", model=model)  # fmt: skip
    kubernetes_validate.validate(job, "1.34.0", strict=True)
    text = yaml.safe_dump(job, sort_keys=False)
    assert_golden(GOLDEN / f"{name}.yaml", text, f"build Job {name}")


def test_the_build_reads_a_cached_model_read_only_and_never_sees_its_secret() -> None:
    s, _ = JOBS["fp8-tp4-pvc-cache"]
    model = cached_model("llm-model-cache", "models/s3-0123456789abcdef/etags-1")
    pod = build_job("llama", "team-a", s, H100, "k", image="b", images=IMAGES, owner=OWNER, model=model)[
        "spec"]["template"]["spec"]  # fmt: skip
    (build,) = pod["containers"]
    assert build["args"][build["args"].index("--model") + 1] == (
        "/var/lib/llm-operator/model-cache/models/s3-0123456789abcdef/etags-1"
    )
    mount = {"name": "model-cache", "mountPath": "/var/lib/llm-operator/model-cache", "readOnly": True}
    assert mount in build["volumeMounts"]
    claim = {"claimName": "llm-model-cache", "readOnly": True}
    assert {"name": "model-cache", "persistentVolumeClaim": claim} in pod["volumes"]
    # The model's Secret goes to its fetch Job only (render/model_fetch.py): no step here downloads.
    assert not any(c.get("envFrom") for c in pod["initContainers"] + pod["containers"])
    with pytest.raises(ValueError, match="reads its model from a claim"):
        build_job("llama", "team-a", s, H100, "k", image="b", images=IMAGES, owner=OWNER)
    with pytest.raises(ValueError, match="credentialsSecretRef is for s3://"):  # nothing downloads it
        spec({"source": {"uri": "pvc://models/llama", "credentialsSecretRef": {"name": "s3-reader"}}})


def test_build_job_pins_the_serving_products_gpus_and_cache() -> None:
    key = cache_key(spec(), H100, "0.20.0")
    job = build_job("llama", "ns", spec(), H100, key, image="builder:1", images=IMAGES, owner=OWNER)
    pod = job["spec"]["template"]["spec"]
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"] == [
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": list(H100.allowed_products)}
    ]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    (c,) = pod["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "4"
    args = dict(zip(c["args"][::2], c["args"][1::2], strict=False))
    assert args["--output"] == f"/engine-cache/engines/{key}" and args["--tp"] == "4"
    assert args["--work-dir"] == f"/engine-cache/engines/.scratch/{key}"
    assert "--trtllm-version" not in args and "--upload" not in args
    assert {"name": "engine-cache", "persistentVolumeClaim": {"claimName": "llm-engine-cache"}} in pod[
        "volumes"
    ]
    assert job["spec"]["backoffLimit"] == 1 and job["spec"]["activeDeadlineSeconds"] == 14400
    assert "ttlSecondsAfterFinished" not in job["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert job["metadata"]["labels"]["llmoperator.io/engine-key"] == key_label(key)
    assert job["metadata"]["labels"]["app.kubernetes.io/component"] == "engine-build"


def test_a_multi_node_world_builds_on_one_pods_gpus() -> None:
    job = build_job("llama", "ns", spec(), MULTI, "k", image="i", images=IMAGES, owner=OWNER)
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert c["args"][c["args"].index("--gpus-per-node") + 1] == "8"


# --- build commands ---------------------------------------------------------------------------


def args(precision: str, sm: str = "sm90", kv: str = "auto", *extra: str) -> list[str]:
    return ["--key", "k", "--model", "/m", "--precision", precision,
            "--kv-cache-dtype", kv, "--sm", sm, "--output", "/out/k", "--work-dir", "/w", "--tp", "2",
            "--pp", "1", "--gpus", "2", "--gpus-per-node", "2", "--max-batch-size", "8",
            "--max-input-len", "1024", "--max-seq-len", "2048", "--max-num-tokens", "2048",
            "--max-beam-width", "1", "--family", "llama", "--calib-dataset", "/calibration/text",
            *extra]  # fmt: skip


def conversion(argv: list[str]) -> tuple[list[str], list[str]]:
    convert, build = b.conversion(b.parse([*argv, "--dry-run"]), "/w/model", "/w")
    return convert, build


def flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


@pytest.mark.parametrize(
    ("precision", "tool", "qformat", "gemm"),
    [("fp16", "convert_checkpoint.py", None, "auto"), ("bf16", "convert_checkpoint.py", None, "auto"),
     ("fp8", "quantize.py", "fp8", "disable"), ("int8-sq", "quantize.py", "int8_sq", "auto"),
     ("int4-awq", "quantize.py", "int4_awq", "auto"), ("w4a8-awq", "quantize.py", "w4a8_awq", "auto")],
)  # fmt: skip
def test_commands_per_precision(precision: str, tool: str, qformat: str | None, gemm: str) -> None:
    convert, build = conversion(args(precision))
    assert convert[0] == sys.executable and convert[1].endswith(tool)
    # No checkpoint at /m: quantized formats fall back to float16 (test_build_inputs.py reads one).
    assert flag(convert, "--dtype") == ("bfloat16" if precision == "bf16" else "float16")
    assert (flag(convert, "--qformat") if qformat else "--qformat" not in convert) == (qformat or True)
    assert flag(convert, "--tp_size") == "2" and flag(convert, "--pp_size") == "1"
    assert flag(convert, "--output_dir") == flag(build, "--checkpoint_dir") == "/w/checkpoint"
    assert flag(build, "--output_dir").startswith("/out/k.partial-")
    assert flag(build, "--gemm_plugin") == gemm
    for name, value in [("--max_batch_size", "8"), ("--max_input_len", "1024"), ("--max_seq_len", "2048"),
                        ("--max_num_tokens", "2048"), ("--max_beam_width", "1"), ("--kv_cache_type", "paged"),
                        ("--gpt_attention_plugin", "auto"), ("--use_paged_context_fmha", "enable"),
                        ("--remove_input_padding", "enable"), ("--workers", "2")]:  # fmt: skip
        assert flag(build, name) == value, name
    assert "--use_fp8_context_fmha" not in build and "--gpus_per_node" not in build


def test_fp8_kv_cache_is_calibrated_and_fp8_attention_used_from_hopper_on() -> None:
    convert, build = conversion(args("fp8", "sm90", "fp8"))
    assert flag(convert, "--kv_cache_dtype") == "fp8"
    assert flag(build, "--use_fp8_context_fmha") == "enable"
    assert "--use_fp8_context_fmha" not in conversion(args("fp8", "sm89", "fp8"))[1]  # Ada: no FP8 FMHA
    convert, _ = conversion(args("fp16", "sm80", "int8"))  # a quantized KV cache alone needs ModelOpt
    assert flag(convert, "--qformat") == "full_prec" and flag(convert, "--kv_cache_dtype") == "int8"


def test_a_world_spanning_pods_maps_ranks_to_each_pods_gpus() -> None:
    argv = args("fp16")
    argv[argv.index("--tp") + 1] = "8"
    _, build = conversion(argv)
    assert flag(build, "--gpus_per_node") == "2" and flag(build, "--workers") == "2"


def test_convert_script_follows_the_model_family(tmp_path: Path) -> None:
    def script(family: str) -> Path:
        return b.Examples([tmp_path], required=False).script(b.converter(family))

    assert script("mistral") == tmp_path / "models/core/llama/convert_checkpoint.py"
    assert script("falcon") == tmp_path / "models/contrib/falcon/convert_checkpoint.py"
    (tmp_path / "qwen").mkdir()
    (tmp_path / "qwen" / "convert_checkpoint.py").write_text("")  # the layout before 0.18
    assert script("qwen") == tmp_path / "qwen/convert_checkpoint.py"
    with pytest.raises(b.BuildError, match="known are llama, mistral"):
        script("mamba")


def test_dry_run_prints_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert b.main([*args("int4-awq", "sm90", "auto", "--upload", "s3://e/k"), "--dry-run"]) == 0
    said, *printed = capsys.readouterr().out.splitlines()
    assert said == "activation dtype float16: /m/config.json does not exist: the default float16"
    lines = [line.split() for line in printed]
    # The download and the upload are the fetch image's (engine/fetch.py), not NVIDIA's image's.
    assert [line[1] for line in lines] == ["HF_HUB_OFFLINE=1", "trtllm-build", "HF_HUB_OFFLINE=1"]
    assert lines[0][1:4] == ["HF_HUB_OFFLINE=1", "HF_DATASETS_OFFLINE=1", sys.executable], "a local dataset"
    assert lines[0][4] == "/app/examples/quantization/quantize.py", "where NVIDIA's image has it"
    assert "--qformat int4_awq" in " ".join(lines[0])
    # The guided decoder's tokenizer info, into a scratch directory of the one the publish step
    # uploads (engine/tokenizer_info.py moves the file out of it once checked).
    script = "/app/examples/generate_xgrammar_tokenizer_info.py"
    scratch = "/out/k/.xgrammar-tokenizer-info"
    assert lines[2][3:] == [sys.executable, script, "--model_dir", "/m", "--output_dir", scratch]


def test_a_cached_engine_is_not_rebuilt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = args("fp16")
    argv[argv.index("/out/k")] = str(tmp_path)
    (tmp_path / b.MARKER).write_text("k\n")
    assert b.main(argv) == 0
    assert "nothing to build" in capsys.readouterr().out


def test_wrong_trtllm_version_fails_without_building(tmp_path: Path) -> None:
    argv = args("fp16", "sm90", "auto", "--trtllm-version", "0.20.0")
    argv[argv.index("/out/k")] = str(tmp_path / "out")
    assert b.main(argv) == b.EXIT_CONFIG  # no tensorrt_llm here: same refusal as a wrong version
    assert not (tmp_path / "out").exists()


def test_an_engine_appears_whole_or_not_at_all(tmp_path: Path) -> None:
    staged, output = tmp_path / "k.partial-a", tmp_path / "k"
    staged.mkdir()
    (staged / "rank0.engine").write_text("new")
    (staged / b.MARKER).write_text("k\n")
    output.mkdir()
    (output / "rank0.engine").write_text("half-written by an older attempt")
    b.publish(staged, output)
    assert (output / "rank0.engine").read_text() == "new" and not staged.exists()
    other = tmp_path / "k.partial-b"  # a second Job of the same key finishing later keeps the first
    other.mkdir()
    (other / b.MARKER).write_text("k\n")
    b.publish(other, output)
    assert (output / "rank0.engine").read_text() == "new" and not other.exists()


def test_the_build_runs_end_to_end_with_stand_in_tools(tmp_path: Path) -> None:
    """Every step for real except the NVIDIA tools, which are scripts recording their argv."""
    bin_dir, model = tmp_path / "bin", tmp_path / "model"
    bin_dir.mkdir()
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (model / "tokenizer.json").write_text("{}")
    (model / "model.safetensors").write_text("weights")
    trtllm_build = bin_dir / "trtllm-build"
    trtllm_build.write_text(f"#!{sys.executable}\nimport sys, pathlib\n"
                            "out = pathlib.Path(sys.argv[sys.argv.index('--output_dir') + 1])\n"
                            "out.mkdir(parents=True)\n(out / 'rank0.engine').write_text('engine')\n"
                            "(out / 'config.json').write_text('{}')\n")  # fmt: skip
    trtllm_build.chmod(0o755)
    examples = tmp_path / "examples" / "models" / "core" / "llama"
    examples.mkdir(parents=True)
    (examples / "convert_checkpoint.py").write_text("import sys; print('convert', sys.argv[1:])\n")
    argv = args("fp16")
    for old, new in (("/m", str(model)), ("/out/k", str(tmp_path / "cache" / "k")),
                     ("/w", str(tmp_path / "cache" / ".scratch" / "k"))):  # fmt: skip
        argv[argv.index(old)] = new
    env = {
        **os.environ,
        "PATH": str(bin_dir),  # no `python` on it: the converter runs on the build's own interpreter
        "LLMOP_TRTLLM_EXAMPLES": str(tmp_path / "examples"),
    }
    command = [sys.executable, "-m", "llm_operator.engine.build", *argv]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    engine = tmp_path / "cache" / "k"
    assert sorted(p.name for p in engine.iterdir()) == ["config.json", b.MARKER, "rank0.engine", "tokenizer"]
    assert sorted(p.name for p in (engine / "tokenizer").iterdir()) == ["config.json", "tokenizer.json"]
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [".scratch", "k"], "no partial left"
    assert not any((tmp_path / "cache" / ".scratch").iterdir()), "scratch space freed"
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert "nothing to build" in again.stdout
