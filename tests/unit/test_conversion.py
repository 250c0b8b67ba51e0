"""Builds that finish: each family's converter with the flags upstream defines, calibration from a
claim without the Hub, and upstream's fp8 rowwise route for models too large to quantize."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator.api.v1alpha1 import LLMDeploymentSpec, ModelFamily
from llm_operator.contract import XGRAMMAR_TOKENIZER_INFO
from llm_operator.engine import build as b
from llm_operator.engine import build_job, cache_key, tokenizer_info
from llm_operator.images import Images
from llm_operator.plan import conversion
from llm_operator.plan.planner import plan_deployment
from llm_operator.plan.types import PlanningError, PoolPlan

from tests import upstream_names as up

UPSTREAM = yaml.safe_load((Path(__file__).parent / "upstream" / "trtllm-v1.1.0-converters.yaml").read_text())
IMAGES = Images("runtime", "cpu-runtime", "", "1.1.0", launcher="launcher:1", fetch="fetch:1")
OWNER = {"apiVersion": "llmoperator.io/v1alpha1", "kind": "LLMDeployment", "name": "m", "uid": "u"}
H100_X8 = PoolPlan("main", "NVIDIA-H100-80GB-HBM3", ("NVIDIA-H100-80GB-HBM3",), (9, 0), 81559, 8, 2, 8, 2, 1)
H200_X8 = dataclasses.replace(H100_X8, gpu_product="NVIDIA-H200", allowed_products=("NVIDIA-H200",),
                              gpu_memory_mib=143771)  # fmt: skip
H100_X4 = dataclasses.replace(H100_X8, tensor=4, pipeline=1, gpus_per_pod=4, pods_per_replica=1)
PRECISIONS = ["fp16", "bf16", "fp8", "int8-sq", "int4-awq", "w4a8-awq"]
CALIBRATION = {"calibration": {"datasetUri": "pvc://llm-calibration/cnn_dailymail"}}
EXAMPLES = Path("/app/examples")


def spec(name: str = "meta-llama/Meta-Llama-3-70B-Instruct", *, build: dict[str, Any] | None = None,
         **engine: Any) -> LLMDeploymentSpec:  # fmt: skip
    return LLMDeploymentSpec.model_validate({
        "model": {"name": name, "source": {"uri": "pvc://models/m"}},
        "engine": {"backend": "tensorrt-engine", "precision": "fp8", "kvCacheDtype": "fp8",
                   "build": CALIBRATION if build is None else build, **engine},
        "parallelism": {"tensor": "auto", "pipeline": "auto"},
        "resources": {"gpu": {"products": ["NVIDIA-H100-80GB-HBM3"]}},
    })  # fmt: skip


def parallel(s: LLMDeploymentSpec, tp: int, pp: int) -> LLMDeploymentSpec:
    return s.model_copy(
        update={"parallelism": s.parallelism.model_copy(update={"tensor": tp, "pipeline": pp})}
    )


def argv(family: str, precision: str, kv: str = "auto", tp: int = 2, pp: int = 1, *extra: str) -> list[str]:
    return ["--key", "k", "--model", "/m", "--precision", precision,
            "--kv-cache-dtype", kv, "--sm", "sm90", "--output", "/out/k", "--work-dir", "/w",
            "--tp", str(tp), "--pp", str(pp), "--gpus", str(min(tp * pp, 8)), "--gpus-per-node", "8",
            "--max-batch-size", "8", "--max-input-len", "1024", "--max-seq-len", "2048",
            "--max-num-tokens", "2048", "--max-beam-width", "1", "--family", family,
            "--calib-dataset", "/calibration/text", *extra]  # fmt: skip


def convert(args: list[str]) -> list[str]:
    scripts = b.Examples([EXAMPLES], required=False)  # where a dry run says each script is
    return b.convert_command(b.parse(args), "/w/model", "/w/checkpoint", scripts, "bfloat16")


def upstream_violations(cmd: list[str]) -> list[str]:
    """Flags (and values of flags with choices) the upstream script does not define."""
    script = str(Path(cmd[1]).relative_to(EXAMPLES))
    if script not in UPSTREAM:
        return [f"no such script upstream: {script}"]
    defined, choices = UPSTREAM[script]["options"], UPSTREAM[script]["choices"]
    bad = [f"{script} {t}" for t in cmd[2:] if t.startswith("-") and t not in defined]
    for i, token in enumerate(cmd[:-1]):
        if token in choices and cmd[i + 1] not in choices[token]:
            bad.append(f"{script} {token} {cmd[i + 1]}")
    return bad


# --- every command line against upstream's argparse definitions ------------------------------

COMMANDS = [
    *[(f, p, kv, False) for f in b.CONVERTERS for p in PRECISIONS for kv in ("auto", "fp8", "int8")],
    *[(f, "fp8", "auto", True) for f in b.CONVERTERS if f in conversion.FP8_ROWWISE],
]


@pytest.mark.parametrize(("family", "precision", "kv", "rowwise"), COMMANDS)
def test_every_command_uses_only_flags_upstream_defines(
    family: str, precision: str, kv: str, rowwise: bool
) -> None:
    pp = 1 if family in conversion.TENSOR_PARALLEL_ONLY else 2
    args = argv(family, precision, kv, 2, pp, *(["--fp8-rowwise"] if rowwise else []))
    assert upstream_violations(convert(args)) == []


def test_the_check_catches_what_the_issue_found() -> None:
    """Gemma's converter has no --tp_size (it takes --world-size); Falcon's is under contrib/."""
    gemma = f"{EXAMPLES}/models/core/gemma/convert_checkpoint.py"
    assert upstream_violations(["python", gemma, "--tp_size", "2"]) == [
        "models/core/gemma/convert_checkpoint.py --tp_size"
    ]
    assert upstream_violations(["python", f"{EXAMPLES}/models/core/falcon/convert_checkpoint.py"])
    quantize = f"{EXAMPLES}/quantization/quantize.py"
    assert upstream_violations(["python", quantize, "--qformat", "int4-awq"]), "a value outside the choices"


def test_each_family_runs_its_own_converter() -> None:
    gemma = convert(argv("gemma", "bf16", "auto", 4, 1))
    assert gemma[1].endswith("models/core/gemma/convert_checkpoint.py")
    assert gemma[gemma.index("--world-size") + 1] == "4" and gemma[gemma.index("--ckpt-type") + 1] == "hf"
    assert "--tp_size" not in gemma and "--pp_size" not in gemma
    with pytest.raises(b.BuildError, match="tensor-parallel only"):
        convert(argv("gemma", "bf16", "auto", 2, 2))
    falcon = convert(argv("falcon", "fp16"))
    assert falcon[1].endswith("models/contrib/falcon/convert_checkpoint.py")
    assert convert(argv("mistral", "fp16"))[1].endswith("models/core/llama/convert_checkpoint.py")
    assert convert(argv("qwen", "fp16"))[1].endswith("models/core/qwen/convert_checkpoint.py")
    # Quantized formats go through ModelOpt for every family, calibrating on the mounted dataset.
    q = convert(argv("gemma", "fp8", "fp8", 2, 1))
    assert q[1].endswith("quantization/quantize.py")
    assert (
        q[q.index("--calib_dataset") + 1] == "/calibration/text" and q[q.index("--calib_size") + 1] == "512"
    )


def test_the_api_planner_and_builder_know_the_same_families() -> None:
    assert [f.value for f in ModelFamily] == list(b.CONVERTERS)
    assert {f.value for f in conversion.FP8_ROWWISE} == {
        f for f, (_, d) in b.CONVERTERS.items() if d == "llama"
    }
    assert [f.value for f in conversion.TENSOR_PARALLEL_ONLY] == list(b.TENSOR_PARALLEL_ONLY)
    assert [f.value for f in conversion.FP8_ROWWISE] == list(b.FP8_ROWWISE)


# --- the family, known before the Job runs ----------------------------------------------------


@pytest.mark.parametrize(
    ("name", "family"),
    [("meta-llama/Meta-Llama-3-70B-Instruct", "llama"), ("TinyLlama/TinyLlama-1.1B-Chat-v1.0", "llama"),
     ("mistralai/Mistral-7B-Instruct-v0.3", "mistral"), ("mistralai/Mixtral-8x7B-v0.1", "mixtral"),
     ("Qwen/Qwen2.5-7B-Instruct", "qwen"), ("google/gemma-2-9b-it", "gemma"), ("tiiuae/falcon-40b", "falcon"),
     ("acme/secret-model", None)],
)  # fmt: skip
def test_the_family_is_told_from_the_name(name: str, family: str | None) -> None:
    found = conversion.family(spec(name).model)
    assert (found.value if found else None) == family


def test_the_family_field_or_source_uri_names_it_otherwise() -> None:
    named = LLMDeploymentSpec.model_validate(
        {"model": {"name": "our-chat", "family": "qwen", "source": {"uri": "pvc://models/m"}}}
    )
    assert conversion.family(named.model) == ModelFamily.QWEN
    hub = LLMDeploymentSpec.model_validate(
        {
            "model": {
                "name": "our-chat",
                "source": {"uri": "hf://google/gemma-7b"},
                "cache": {"claimName": "mc"},
            }
        }
    )
    assert conversion.family(hub.model) == ModelFamily.GEMMA


def test_an_unknown_family_is_refused_at_planning_unless_nothing_is_built() -> None:
    unknown = spec("acme/secret-model", precision="fp16", kvCacheDtype="auto").model_copy(
        update={"parallelism": spec().parallelism.model_copy(update={"tensor": 4, "pipeline": 1})}
    )
    with pytest.raises(PlanningError) as e:
        plan_deployment(unknown, None, 1)
    assert e.value.reason == "UnknownModelFamily"
    assert e.value.message.endswith(
        "set spec.model.family to one of llama, mistral, mixtral, qwen, gemma, falcon"
    )
    prebuilt = unknown.model_copy(update={"engine": unknown.engine.model_copy(
        update={"build": None, "prebuilt": {"uri": "pvc://engines/x"}})})  # fmt: skip
    conversion.check(prebuilt)  # a prebuilt engine needs no converter


# --- calibration without the Hub --------------------------------------------------------------


@pytest.mark.parametrize(("precision", "kv"), [("fp8", "auto"), ("int4-awq", "auto"), ("fp16", "int8")])
def test_a_quantized_build_without_a_dataset_is_refused_at_planning(precision: str, kv: str) -> None:
    with pytest.raises(PlanningError) as e:
        plan_deployment(spec(build={}, precision=precision, kvCacheDtype=kv), None, 1)
    assert e.value.reason == "CalibrationDatasetMissing"
    assert "set engine.build.calibration.datasetUri to pvc://CLAIM/PATH" in e.value.message
    plan_deployment(spec(build={}, precision="bf16", kvCacheDtype="auto"), None, 1)  # nothing to calibrate


def test_the_dataset_claim_is_mounted_read_only_and_passed_to_quantize() -> None:
    s = spec(build={"calibration": {"datasetUri": "pvc://datasets/text/v2/", "size": 256}})
    pod = build_job("m", "ns", s, H100_X4, "k", image="i", images=IMAGES, owner=OWNER)["spec"]["template"][
        "spec"
    ]
    (c,) = pod["containers"]
    assert {"name": "calibration", "mountPath": "/calibration", "readOnly": True} in c["volumeMounts"]
    assert {
        "name": "calibration",
        "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True},
    } in pod["volumes"]
    args = c["args"]
    assert args[args.index("--calib-dataset") + 1] == "/calibration/text/v2"
    assert args[args.index("--calib-size") + 1] == "256" and args[args.index("--family") + 1] == "llama"


def test_a_hub_dataset_is_used_only_where_named() -> None:
    hub = spec(build={"calibration": {"datasetUri": "hf://abisee/cnn_dailymail"}})
    pod = build_job("m", "ns", hub, H100_X4, "k", image="i", images=IMAGES, owner=OWNER)["spec"]["template"][
        "spec"
    ]
    assert "calibration" not in [v["name"] for v in pod["volumes"]]
    args = b.parse([*argv("llama", "fp8")[:-1], "hf://abisee/cnn_dailymail"])
    assert b.calib_dataset(args.calib_dataset) == "abisee/cnn_dailymail" and b.conversion_env(args) == {}
    local = b.parse(argv("llama", "fp8"))
    assert b.conversion_env(local) == {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    with pytest.raises(b.BuildError, match=r"engine\.build\.calibration\.datasetUri"):
        b.calib_dataset(None)


def test_the_calibration_data_is_part_of_the_engine_key() -> None:
    base = cache_key(spec(), H100_X4, "1.1.0")
    other = spec(build={"calibration": {"datasetUri": "pvc://llm-calibration/other"}})
    smaller = spec(build={"calibration": {"datasetUri": "pvc://llm-calibration/cnn_dailymail", "size": 64}})
    assert len({base, cache_key(other, H100_X4, "1.1.0"), cache_key(smaller, H100_X4, "1.1.0")}) == 3
    bf16 = spec(build={}, precision="bf16", kvCacheDtype="auto")
    bf16_calibrated = spec(build=CALIBRATION, precision="bf16", kvCacheDtype="auto")
    assert cache_key(bf16, H100_X4, "1.1.0") == cache_key(bf16_calibrated, H100_X4, "1.1.0"), (
        "nothing calibrates"
    )


def stand_in_build(
    tmp_path: Path, scripts: dict[str, str], info_timeout_s: int | None = None
) -> subprocess.CompletedProcess[str]:
    """The real build.py of an fp8 Llama with stand-in tools: `scripts` (examples/ path -> source),
    and a trtllm-build that makes its output directory."""
    bin_dir, model = tmp_path / "bin", tmp_path / "model"
    for d in (bin_dir, model):
        d.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    for path, source in scripts.items():
        (tmp_path / "examples" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "examples" / path).write_text(source)
    trtllm_build = bin_dir / "trtllm-build"
    trtllm_build.write_text(f"#!{sys.executable}\nimport sys, pathlib\n"
                            "out = sys.argv[sys.argv.index('--output_dir') + 1]\n"
                            "pathlib.Path(out).mkdir(parents=True)\n")  # fmt: skip
    trtllm_build.chmod(0o755)
    args = argv("llama", "fp8", "fp8")
    for old, new in (
        ("/m", str(model)),
        ("/out/k", str(tmp_path / "cache" / "k")),
        ("/w", str(tmp_path / "w")),
    ):
        args[args.index(old)] = new
    env = {
        **os.environ,
        "PATH": str(bin_dir),  # no `python` on it: the build runs its scripts on its own interpreter
        "LLMOP_TRTLLM_EXAMPLES": str(tmp_path / "examples"),
    }
    env.pop("HF_HUB_OFFLINE", None)
    # As `python3 -m llm_operator.engine.build`, with the tokenizer info step's timeout set first.
    code = (f"import runpy, sys; from llm_operator.engine import tokenizer_info as t; t.TIMEOUT_SECONDS = "
            f"{info_timeout_s or tokenizer_info.TIMEOUT_SECONDS}; sys.argv[1:] = {args!r}; "
            "runpy.run_module('llm_operator.engine.build', run_name='__main__', alter_sys=True)")  # fmt: skip
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def recorder(record: Path, then: str = "") -> str:
    """A stand-in script: writes its arguments and the offline variables to `record`, then runs `then`."""
    return (
        "import os, sys, pathlib\n"
        f"pathlib.Path({str(record)!r}).write_text(' '.join(sys.argv[1:]) + ' HF_HUB_OFFLINE=' "
        "+ os.environ.get('HF_HUB_OFFLINE', '') + ' HF_DATASETS_OFFLINE=' "
        "+ os.environ.get('HF_DATASETS_OFFLINE', ''))\n" + then
    )


def test_quantize_runs_offline_on_the_mounted_dataset(tmp_path: Path) -> None:
    """The real build.py with stand-in tools: quantize.py sees the dataset and no way to the Hub."""
    record = tmp_path / "quantize.txt"
    run = stand_in_build(tmp_path, {"quantization/quantize.py": recorder(record)})
    assert run.returncode == 0, run.stdout + run.stderr
    seen = record.read_text()
    assert "--calib_dataset /calibration/text" in seen and "--kv_cache_dtype fp8" in seen
    assert seen.endswith("HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1")


# --- xgrammar's tokenizer info beside the engine ---------------------------------------------

# What upstream's script does with its arguments (examples/generate_xgrammar_tokenizer_info.py):
# <--output_dir>/xgrammar_tokenizer_info.json, here upstream's file in small (tests/upstream_names.py).
INFO = json.dumps(up.XGRAMMAR_TOKENIZER_INFO_EXAMPLE)
OUTPUT = "out = pathlib.Path(sys.argv[sys.argv.index('--output_dir') + 1]) / 'xgrammar_tokenizer_info.json'\n"
WRITES_INFO = f"{OUTPUT}out.parent.mkdir(parents=True, exist_ok=True)\nout.write_text({INFO!r})\n"


def test_the_build_writes_the_guided_decoders_tokenizer_info_beside_the_engine(tmp_path: Path) -> None:
    """Upstream's script, from the examples of the key's version, on the checkpoint's tokenizer,
    offline, into the engine before its marker: the published engine has it, and nothing else of
    the step."""
    record = tmp_path / "info.txt"
    run = stand_in_build(
        tmp_path, {"quantization/quantize.py": "", tokenizer_info.SCRIPT: recorder(record, WRITES_INFO)}
    )
    assert run.returncode == 0, run.stdout + run.stderr
    engine = tmp_path / "cache" / "k"
    assert (engine / XGRAMMAR_TOKENIZER_INFO).read_text() == INFO
    assert (engine / b.MARKER).read_text() == "k\n"
    assert sorted(p.name for p in engine.iterdir()) == sorted(
        [XGRAMMAR_TOKENIZER_INFO, b.MARKER, "tokenizer"]
    )
    said = re.fullmatch(r"--model_dir (\S+) --output_dir (\S+) (.*)", record.read_text())
    assert said is not None, record.read_text()
    model_dir, output_dir, offline = said.groups()
    assert model_dir == str(tmp_path / "model") and output_dir.startswith(f"{engine}.partial-")
    assert offline == "HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1"
    scripts = b.Examples([EXAMPLES], required=False)
    assert upstream_violations(b.tokenizer_info_command("/m", "/e", scripts)) == []


# Scripts that die or hang partway, as an OOM kill, a full disk or a stuck filesystem leave them.
TORN_INFO = {
    "exits 1": (None, "import sys\nsys.exit('no tokenizer_str')\n", "exited 1"),
    "missing": (None, None, f"examples/{tokenizer_info.SCRIPT} is in none of"),
    "a truncated file, exit 0": (None, f"{OUTPUT}out.parent.mkdir()\nout.write_text({INFO[:40]!r})\n",
                                 "nothing the guided decoder can load"),
    "a whole file, then exit 1": (None, f"{WRITES_INFO}sys.exit(1)\n", "exited 1"),
    "a part, then hangs": (1, f"{OUTPUT}out.parent.mkdir()\nout.write_text({INFO[:40]!r})\n"
                              "import time\ntime.sleep(50)\n", "did not finish in 1s"),
}  # fmt: skip


@pytest.mark.parametrize(("timeout_s", "script", "why"), TORN_INFO.values(), ids=TORN_INFO.keys())
def test_an_engine_whose_tokenizer_info_fails_is_kept_without_it(
    tmp_path: Path, timeout_s: int | None, script: str | None, why: str
) -> None:
    """A failure costs guided decoding, not the engine, and leaves no file: the engine is cached
    under a key that does not change, so a torn file would fail the model's load in every pod that
    served it, for good."""
    script = f"import pathlib, sys\n{script}" if script else None
    scripts = {"quantization/quantize.py": "", **({tokenizer_info.SCRIPT: script} if script else {})}
    run = stand_in_build(tmp_path, scripts, info_timeout_s=timeout_s)
    assert run.returncode == 0, run.stdout + run.stderr
    engine = tmp_path / "cache" / "k"
    assert sorted(p.name for p in engine.iterdir()) == sorted([b.MARKER, "tokenizer"])
    assert "engine build: no xgrammar tokenizer info (" in run.stderr and why in run.stderr, run.stderr
    assert "serves without guided decoding" in run.stderr


def test_a_tokenizer_info_step_that_cannot_start_leaves_no_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An OSError (here no interpreter; a full disk alike) is a failed step, not a failed build."""
    (tmp_path / XGRAMMAR_TOKENIZER_INFO).write_text(INFO)  # an older attempt's: not kept either
    tokenizer_info.write(
        tokenizer_info.command(str(tmp_path / "none"), "s.py", "/m", str(tmp_path)), tmp_path, {}
    )
    assert list(tmp_path.iterdir()) == []
    assert "(FileNotFoundError: " in capsys.readouterr().err


def test_a_dry_run_names_the_tokenizer_info_step() -> None:
    printed = subprocess.run([sys.executable, "-m", "llm_operator.engine.build", *argv("llama", "fp8", "fp8"),
                              "--dry-run"], capture_output=True, text=True, timeout=60, env={**os.environ,
                              "LLMOP_TRTLLM_EXAMPLES": ""})  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    last = printed.stdout.splitlines()[-1]
    assert last.startswith("+ HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 ")
    staged = f"/out/k.partial-{socket.gethostname()}"
    assert last.endswith(
        f"{EXAMPLES}/{tokenizer_info.SCRIPT} --model_dir /m --output_dir {staged}/{tokenizer_info.SCRATCH}"
    )


# --- the large-model fp8 route ----------------------------------------------------------------

LLAMA_405B = "meta-llama/Llama-3.1-405B-Instruct"


def test_the_route_follows_model_size_against_the_builds_gpu_memory() -> None:
    assert conversion.fp8_rowwise(spec(LLAMA_405B), H100_X8), "812 GB of bf16 weights, 8 x 80 GB"
    assert not conversion.fp8_rowwise(spec(LLAMA_405B), H200_X8), "8 x 141 GB hold it: ModelOpt calibrates"
    assert not conversion.fp8_rowwise(spec(), H100_X4), "70B on 4 x 80 GB: ModelOpt calibrates"
    assert not conversion.fp8_rowwise(spec(LLAMA_405B, precision="int4-awq"), H100_X8), "fp8 only"
    one_gpu = dataclasses.replace(H100_X4, tensor=1, gpus_per_pod=1)
    assert not conversion.fp8_rowwise(spec("Qwen/Qwen2.5-72B-Instruct"), one_gpu), (
        "the llama converter's only"
    )
    blackwell = dataclasses.replace(H100_X8, compute_capability=(10, 0), gpu_memory_mib=81559)
    assert not conversion.fp8_rowwise(spec(LLAMA_405B), blackwell), "upstream: only SM90"


def test_a_405b_fp8_build_converts_shard_by_shard_without_calibration() -> None:
    s = spec(LLAMA_405B, build={}, kvCacheDtype="auto")  # no dataset needed on this route
    plan_deployment(parallel(s, 8, 2), None, 1)
    job = build_job("m", "ns", s, H100_X8, "k", image="i", images=IMAGES, owner=OWNER)
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert "--fp8-rowwise" in c["args"] and "--calib-dataset" not in c["args"]
    cmd = convert(argv("llama", "fp8", "auto", 8, 2, "--fp8-rowwise"))
    assert cmd[1].endswith("models/core/llama/convert_checkpoint.py")
    assert "--use_fp8_rowwise" in cmd and "--load_by_shard" in cmd
    assert cmd[cmd.index("--workers") + 1] == "8" and "--calib_dataset" not in cmd
    assert cache_key(s, H100_X8, "1.1.0") != cache_key(
        s, dataclasses.replace(H100_X8, gpu_memory_mib=143771), "1.1.0"
    )


@pytest.mark.parametrize("kv", ["fp8", "int8"])
def test_the_route_has_no_quantized_kv_cache(kv: str) -> None:
    """Upstream's 405B route passes no KV cache option: a quantized one is refused, not guessed."""
    with pytest.raises(PlanningError) as e:
        plan_deployment(parallel(spec(LLAMA_405B, build={}, kvCacheDtype=kv), 8, 2), None, 1)
    assert e.value.reason == "KvCacheDtypeUnsupported"
    assert e.value.message == (
        "meta-llama/Llama-3.1-405B-Instruct in fp8 is too large to calibrate on 8 NVIDIA-H100-80GB-HBM3, so "
        "it is converted shard by shard (fp8 rowwise), which leaves the KV cache unquantized: set "
        "engine.kvCacheDtype to auto"
    )
    with pytest.raises(b.BuildError, match="large-model fp8 route"):
        convert(argv("llama", "fp8", kv, 8, 2, "--fp8-rowwise"))
