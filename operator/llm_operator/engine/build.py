"""What an engine-build Job runs in NVIDIA's tritonserver trtllm image, with that image's python3:
`python3 -m llm_operator.engine.build ARGS` (args from build_job; the package arrives by
injection, so this module is standard library only). The converters run on the same interpreter
(sys.executable): NVIDIA's Dockerfiles install python3, not `python`.

The fetch init container (engine/fetch.py, in our fetch image) ran first: it found the key in the
cache (CACHED in the work directory: this ends at once) or put TensorRT-LLM's examples of the
key's version in `<work>/trtllm-examples` when it has them; the build takes its scripts from
there, else from the image's own `/app/examples`. The checkpoint (`--model`) is a mounted
directory: the model cache's claim or a pvc:// source, read-only; quantized builds take their
activation dtype from its config.json. This checks that the image's TensorRT-LLM version and the
GPUs' architecture are the ones in the key (exit 78 otherwise: the Job fails without retrying),
converts the checkpoint with its family's converter or quantizes it with ModelOpt (calibrating on
the dataset the spec names, offline unless that is a Hub dataset) and runs trtllm-build with flags
chosen per precision as TensorRT-LLM documents them, copies the tokenizer next to the engine with
xgrammar's view of it (the guided decoder's, when it can load it: tokenizer_info.py) and writes
the marker last. On pvc:// caches engines are built beside their final directory and renamed into
place, so readers (and a second Job building the same key) never see a half-written one; for
object-store caches the publish container uploads the staged engine.
`--dry-run` prints the commands instead of running them.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from llm_operator.engine import tokenizer_info

MARKER = "llm-operator-engine.complete"
EXIT_CONFIG = 78
CACHED = ".llm-operator-cached"  # written by engine/fetch.py: the key is in the cache already
# TensorRT-LLM's examples (convert_checkpoint.py, quantization/quantize.py), first found wins: the
# copy of the key's version the fetch init container put in the work directory
# (LLMOP_TRTLLM_EXAMPLES; optional: a fetch image without them copies none), then the build
# image's own. NVIDIA's tritonserver trtllm image is built with `WORKDIR /app` and `COPY
# .../tensorrt_llm/examples examples` (triton-inference-server/tensorrtllm_backend
# dockerfile/Dockerfile.triton.trt_llm_backend, every commit since adc0cc0 of 2025-06-09; at
# 49aba4a, the TensorRT-LLM 1.1 image, lines 184 and 189).
IMAGE_EXAMPLES = "/app/examples"
QUANTIZE = "quantization/quantize.py"
# The converters run on this interpreter, the one with tensorrt_llm (no NVIDIA Dockerfile
# installs a `python`).
PYTHON = sys.executable or "python3"

# precision -> ModelOpt quantize.py --qformat; fp16/bf16 go through the family's convert_checkpoint.py
QFORMAT = {"fp8": "fp8", "int8-sq": "int8_sq", "int4-awq": "int4_awq", "w4a8-awq": "w4a8_awq"}
QUANTIZED_KV = ("fp8", "int8")
# Model family (spec.model.family) -> (examples/models/<tier>, directory) of its convert_checkpoint.py
# in NVIDIA/TensorRT-LLM at v1.1.0 (tests/unit/upstream/trtllm-v1.1.0-converters.yaml pins their options):
# - llama: examples/models/core/llama/convert_checkpoint.py; Mistral (that directory's README,
#   "Mistral v0.1", "Mistral Nemo") and Mixtral (examples/models/core/mixtral/README.md:
#   "../llama/convert_checkpoint.py") convert with this same script.
# - qwen: examples/models/core/qwen/convert_checkpoint.py (Qwen, Qwen2, Qwen2.5).
# - gemma: examples/models/core/gemma/convert_checkpoint.py: --ckpt-type, --model-dir,
#   --output-model-dir, --world-size (tensor parallelism only: no --tp_size/--pp_size).
# - falcon: examples/models/contrib/falcon/convert_checkpoint.py.
CONVERTERS: dict[str, tuple[str, str]] = {
    "llama": ("core", "llama"),
    "mistral": ("core", "llama"),
    "mixtral": ("core", "llama"),
    "qwen": ("core", "qwen"),
    "gemma": ("core", "gemma"),
    "falcon": ("contrib", "falcon"),
}
# Families whose converter shards tensor-parallel only (the planner keeps their pp at 1).
TENSOR_PARALLEL_ONLY = ("gemma",)
# Families whose converter has upstream's large-model FP8 route (--use_fp8_rowwise --load_by_shard).
FP8_ROWWISE = ("llama", "mistral", "mixtral")
# The environment of the conversion step without a named hub dataset: nothing reaches the Hub.
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
TOKENIZER_FILES = ("tokenizer*", "special_tokens_map.json", "generation_config.json", "config.json",
                   "vocab.*", "merges.txt")  # fmt: skip


class BuildError(Exception):
    """This image or node cannot build this key: exit EXIT_CONFIG."""


class Examples:
    """TensorRT-LLM's examples directories, searched in order; a dry run names the first place it
    would look for a script none of them has, a build refuses."""

    def __init__(self, roots: Sequence[str | Path], *, required: bool = True) -> None:
        self.roots, self.required = tuple(Path(r) for r in roots), required

    def script(self, candidates: Sequence[str]) -> Path:
        """The first of `candidates` (paths relative to examples/) under the first root with one."""
        for root in self.roots:
            for candidate in candidates:
                if (root / candidate).is_file():
                    return root / candidate
        if not self.required:
            return self.roots[0] / candidates[0]
        raise BuildError(
            f"TensorRT-LLM's examples/{candidates[0]} is in none of {', '.join(map(str, self.roots))}: "
            "the fetch image copies those of the key's TensorRT-LLM version when it carries them "
            "(/opt/trtllm-examples/v<version>), NVIDIA's tritonserver trtllm image has its own; use a "
            "fetch image or an engine.build.image that has them"
        )


def examples(required: bool = True) -> Examples:
    """The fetch image's copy of the key's version when it made one, then the image's own."""
    fetched = os.environ.get("LLMOP_TRTLLM_EXAMPLES")
    return Examples([p for p in (fetched, IMAGE_EXAMPLES) if p], required=required)


def activation_dtype(precision: str, model_dir: str | Path) -> tuple[str, str]:
    """--dtype of the conversion, and why. fp16/bf16 say it; quantized formats keep the
    checkpoint's own 16-bit type (config.json `torch_dtype`, `dtype` since transformers 4.56,
    huggingface/transformers#39782), as upstream does: the 405B FP8 recipe converts a bf16 model
    with --dtype bfloat16 (NVIDIA/TensorRT-LLM v1.1.0 examples/models/core/llama/README.md), and
    quantize.py's default --dtype auto takes hf_config.torch_dtype (tensorrt_llm/quantization/
    quantize_by_modelopt.py quantize_and_export, copy 042c510d). A float32 or undeclared checkpoint
    gets float16: the engine's activations are 16-bit either way, and float16 is what every
    quantized build used before."""
    if precision in ("fp16", "bf16"):
        return ("bfloat16" if precision == "bf16" else "float16"), f"precision {precision}"
    config = Path(model_dir) / "config.json"
    try:
        declared = json.loads(config.read_text())
    except FileNotFoundError:
        return "float16", f"{config} does not exist: the default float16"
    except (OSError, ValueError) as e:
        raise BuildError(
            f"{config} cannot be read as JSON ({e}): is {model_dir} a Hugging Face checkpoint?"
        ) from None
    found = declared.get("torch_dtype", declared.get("dtype")) if isinstance(declared, dict) else None
    if found in ("bfloat16", "float16"):
        return found, f"the checkpoint's torch_dtype {found}"
    if found is None:
        return "float16", f"{config} declares no torch_dtype: the default float16"
    return "float16", f"the checkpoint's torch_dtype is {found}, not a 16-bit type: float16"


def converter(family: str) -> list[str]:
    """convert_checkpoint.py of the family, relative to examples/: models/{core,contrib}/<dir>/
    since TensorRT-LLM 0.18, <dir>/ before."""
    if family not in CONVERTERS:
        raise BuildError(f"no TensorRT-LLM checkpoint converter known for family {family}: "
                         f"known are {', '.join(CONVERTERS)}")  # fmt: skip
    tier, name = CONVERTERS[family]
    paths = [f"models/{t}/{name}/convert_checkpoint.py" for t in (tier, "core", "contrib")]
    return list(dict.fromkeys([*paths, f"{name}/convert_checkpoint.py"]))


def calib_dataset(uri: str | None) -> str:
    """quantize.py --calib_dataset: a local dataset directory (the mounted claim) or, only where the
    spec names one, a Hub dataset (hf://ORG/NAME -> ORG/NAME)."""
    if not uri:
        raise BuildError("quantized formats and quantized KV caches calibrate on a dataset: set "
                         "engine.build.calibration.datasetUri (pvc://CLAIM/PATH)")  # fmt: skip
    return uri.removeprefix("hf://")


def convert_command(
    a: argparse.Namespace, model_dir: str, checkpoint: str, scripts: Examples, dtype: str
) -> list[str]:
    """Checkpoint -> TensorRT-LLM checkpoint sharded tp x pp, with the family's converter flags and
    activation `dtype`. Quantized formats and quantized KV caches need calibration, which
    ModelOpt's quantize.py does for every family, except on the large-model FP8 route
    (--fp8-rowwise), where the converter quantizes shard by shard with no calibration (fp8
    rowwise scales come from the weights, per token at run time) and the KV cache stays
    unquantized."""
    qformat = QFORMAT.get(a.precision)
    quant_kv = a.kv_cache_dtype in QUANTIZED_KV
    if a.fp8_rowwise:
        # NVIDIA/TensorRT-LLM v1.1.0 examples/models/core/llama/README.md, Llama 3.1 405B "Run BF16
        # model by FP8": convert_checkpoint.py --use_fp8_rowwise --load_by_shard --workers N.
        if a.family not in FP8_ROWWISE or a.precision != "fp8" or quant_kv:
            raise BuildError(f"the large-model fp8 route is for fp8 weights of the {', '.join(FP8_ROWWISE)} "
                             "families with an unquantized KV cache")  # fmt: skip
        return [PYTHON, str(scripts.script(converter(a.family))), "--model_dir", model_dir,
                "--output_dir", checkpoint, "--dtype", dtype, "--tp_size", str(a.tp),
                "--pp_size", str(a.pp), "--use_fp8_rowwise", "--load_by_shard",
                "--workers", str(min(a.tp * a.pp, a.gpus))]  # fmt: skip
    if qformat is None and not quant_kv:
        script = str(scripts.script(converter(a.family)))
        if a.family in TENSOR_PARALLEL_ONLY:
            if a.pp != 1:
                raise BuildError(f"the {a.family} converter shards tensor-parallel only: use pipeline 1")
            return [PYTHON, script, "--ckpt-type", "hf", "--model-dir", model_dir,
                    "--output-model-dir", checkpoint, "--dtype", dtype,
                    "--world-size", str(a.tp)]  # fmt: skip
        return [PYTHON, script, "--model_dir", model_dir, "--output_dir", checkpoint,
                "--dtype", dtype, "--tp_size", str(a.tp), "--pp_size", str(a.pp)]  # fmt: skip
    # NVIDIA/TensorRT-LLM v1.1.0 examples/quantization/quantize.py: --calib_dataset takes a Hub name
    # or a local directory, read by tensorrt_llm/quantization/quantize_by_modelopt.py
    # get_calib_dataloader (a directory: its train split, text column).
    cmd = [PYTHON, str(scripts.script([QUANTIZE])), "--model_dir", model_dir,
           "--output_dir", checkpoint, "--dtype", dtype, "--qformat", qformat or "full_prec",
           "--calib_dataset", calib_dataset(a.calib_dataset), "--calib_size", str(a.calib_size),
           "--tp_size", str(a.tp), "--pp_size", str(a.pp)]  # fmt: skip
    if quant_kv:
        cmd += ["--kv_cache_dtype", a.kv_cache_dtype]
    return cmd


def conversion_env(a: argparse.Namespace) -> dict[str, str]:
    """Offline unless the spec names a Hub calibration dataset: the checkpoint is local by now."""
    return {} if (a.calib_dataset or "").startswith("hf://") else dict(OFFLINE)


def build_command(a: argparse.Namespace, checkpoint: str, engine: str) -> list[str]:
    """trtllm-build with every knob explicit (defaults move between releases). In-flight batching
    needs the attention plugin, removed input padding and a paged KV cache; KV reuse and chunked
    context need paged context FMHA."""
    cmd = [
        "trtllm-build", "--checkpoint_dir", checkpoint, "--output_dir", engine,
        "--max_batch_size", str(a.max_batch_size), "--max_input_len", str(a.max_input_len),
        "--max_seq_len", str(a.max_seq_len), "--max_num_tokens", str(a.max_num_tokens),
        "--max_beam_width", str(a.max_beam_width), "--kv_cache_type", "paged",
        "--gpt_attention_plugin", "auto", "--remove_input_padding", "enable",
        "--use_paged_context_fmha", "enable", "--workers", str(min(a.tp * a.pp, a.gpus)),
        # The GEMM plugin helps fp16/bf16 (and the unquantized GEMMs of int8/int4); FP8 GEMMs
        # are faster without it.
        "--gemm_plugin", "disable" if a.precision == "fp8" else "auto",
    ]  # fmt: skip
    fp8_activations = a.precision in ("fp8", "w4a8-awq") and a.kv_cache_dtype == "fp8"
    if fp8_activations and int(a.sm.removeprefix("sm")) >= 90:
        cmd += ["--use_fp8_context_fmha", "enable"]  # Hopper and newer: FP8 attention in context
    if a.tp * a.pp > a.gpus_per_node:
        # Each rank's device is rank % gpus_per_node: it must match the GPUs of one serving pod.
        cmd += ["--gpus_per_node", str(a.gpus_per_node)]
    return cmd


def tokenizer_info_command(model_dir: str, engine: str, scripts: Examples) -> list[str]:
    return tokenizer_info.command(PYTHON, scripts.script([tokenizer_info.SCRIPT]), model_dir, engine)


def add_tokenizer_info(model_dir: str, engine: Path) -> None:
    """The guided decoder's file beside the engine (engine/tokenizer_info.py), offline: without
    it the engine serves unguided, so no failure here fails a finished build."""
    try:
        cmd = tokenizer_info_command(model_dir, str(engine), examples())
    except BuildError as e:
        return tokenizer_info.skipped(str(e))
    tokenizer_info.write(cmd, engine, OFFLINE)


def staging(a: argparse.Namespace) -> str:
    """Where trtllm-build writes: beside the final directory (renamed into place when complete),
    or the local directory an object-store upload reads."""
    return a.output if a.upload else f"{a.output}.partial-{socket.gethostname()}"


def conversion(a: argparse.Namespace, model_dir: str, work: str) -> list[list[str]]:
    """Convert or quantize, then build into the staging directory."""
    checkpoint = f"{work}/checkpoint"
    dtype, why = activation_dtype(a.precision, model_dir)
    print(f"activation dtype {dtype}: {why}", flush=True)
    convert = convert_command(a, model_dir, checkpoint, examples(required=not a.dry_run), dtype)
    return [convert, build_command(a, checkpoint, staging(a))]


def cached(a: argparse.Namespace) -> bool:
    """The fetch container found the key in the cache, or (pvc://) the marker is in place."""
    if (Path(a.work_dir) / CACHED).is_file():
        return True
    marker = Path(a.output) / MARKER
    return not a.upload and marker.is_file() and marker.read_text().strip() == a.key


def check_environment(a: argparse.Namespace) -> None:
    """The key promises a TensorRT-LLM version and a GPU architecture: refuse to build otherwise."""
    if a.trtllm_version:
        try:
            installed = importlib.metadata.version("tensorrt_llm")
        except importlib.metadata.PackageNotFoundError:
            raise BuildError("tensorrt_llm is not installed in this image") from None
        if installed != a.trtllm_version:
            raise BuildError(
                f"this image has TensorRT-LLM {installed}, the engine key needs {a.trtllm_version}: "
                "use the builder image of the runtime's version"
            )
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"]
        found = {
            "sm" + line.strip().replace(".", "") for line in subprocess.check_output(query, text=True).split()
        }
        if found != {a.sm}:
            raise BuildError(f"GPUs here are {', '.join(sorted(found))}, the engine key needs {a.sm}")


def copy_tokenizer(model_dir: str | Path, engine: str | Path) -> None:
    """Serving reads the tokenizer next to the engine (tokenizer_dir = <engine>/tokenizer)."""
    dest = Path(engine) / "tokenizer"
    dest.mkdir(parents=True, exist_ok=True)
    for pattern in TOKENIZER_FILES:
        for f in Path(model_dir).glob(pattern):
            if f.is_file():
                shutil.copy(f, dest / f.name)


def publish(staged: Path, output: Path) -> None:
    """Rename the complete engine into place; if another build of this key got there first, keep
    theirs (identical inputs) and drop ours."""
    if (output / MARKER).is_file():
        shutil.rmtree(staged)
        return
    if output.exists():
        shutil.rmtree(output)  # an incomplete engine from an older attempt
    try:
        staged.rename(output)
    except OSError:
        if not (output / MARKER).is_file():
            raise
        shutil.rmtree(staged)


def run(cmd: list[str], dry_run: bool, env: dict[str, str] | None = None) -> None:
    print("+", shlex.join([*(f"{k}={v}" for k, v in (env or {}).items()), *cmd]), flush=True)
    if not dry_run:
        subprocess.run(cmd, check=True, env={**os.environ, **env} if env else None)


def build(a: argparse.Namespace) -> None:
    work, source = Path(a.work_dir), Path(a.model)  # a mounted directory: the model cache, a pvc:// source
    convert, trtllm_build = conversion(a, str(source), str(work))
    if a.dry_run:
        run(convert, dry_run=True, env=conversion_env(a))
        run(trtllm_build, dry_run=True)
        info = tokenizer_info_command(str(source), staging(a), examples(required=False))
        run(info, dry_run=True, env=dict(OFFLINE))
        return
    check_environment(a)
    staged = Path(staging(a))
    shutil.rmtree(staged, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    try:
        run(convert, dry_run=False, env=conversion_env(a))
        run(trtllm_build, dry_run=False)
        copy_tokenizer(source, staged)
        add_tokenizer_info(str(source), staged)
        (staged / MARKER).write_text(a.key + "\n")
        if not a.upload:
            publish(staged, Path(a.output))
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the converted checkpoint
        if not a.upload:
            shutil.rmtree(staged, ignore_errors=True)  # a failed attempt's partial engine


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="llm_operator.engine.build")
    for name in ("key", "model", "precision", "kv-cache-dtype", "sm", "output", "work-dir"):
        p.add_argument(f"--{name}", required=True)
    for name in ("tp", "pp", "gpus", "gpus-per-node", "max-batch-size", "max-input-len", "max-seq-len",
                 "max-num-tokens", "max-beam-width"):  # fmt: skip
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--family", required=True, choices=list(CONVERTERS), help="which converter")
    p.add_argument("--calib-dataset", help="dataset directory (a mounted claim) or hf://ORG/NAME")
    p.add_argument("--calib-size", type=int, default=512, help="calibration samples")
    p.add_argument("--fp8-rowwise", action="store_true", help="large-model fp8: convert shard by shard")
    p.add_argument("--upload", help="s3:// or gs:// directory of this key: the engine stays in --output "
                   "for the publish container to upload")  # fmt: skip
    p.add_argument("--trtllm-version", help="refuse to build with any other TensorRT-LLM version")
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args(argv)
    if a.precision not in ("fp16", "bf16", *QFORMAT):
        p.error(f"unknown precision {a.precision}")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    try:
        if not a.dry_run and cached(a):
            print(f"engine {a.key} is already in the cache: nothing to build", flush=True)
            if not a.upload:  # on the cache volume; the publish container reads CACHED otherwise
                shutil.rmtree(a.work_dir, ignore_errors=True)
            return 0
        build(a)
    except BuildError as e:
        print(f"engine build: {e}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    except subprocess.CalledProcessError as e:
        print(f"engine build: {shlex.join(e.cmd)} exited {e.returncode}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
