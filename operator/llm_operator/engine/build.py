"""What an engine-build Job runs in NVIDIA's tritonserver trtllm image, with that image's python3:
`python3 -m llm_operator.engine.build ARGS` (args from build_job; the package arrives by
injection, so this module is standard library only).

The fetch init container (engine/fetch.py, in our fetch image) ran first: it found the key in the
cache (CACHED in the work directory: this ends at once) or put the checkpoint in `<work>/model`
(pvc:// sources are read in place) and TensorRT-LLM's examples in `<work>/trtllm-examples`. This
checks that the image's TensorRT-LLM version and the GPUs' architecture are the ones in the key
(exit 78 otherwise: the Job fails without retrying), converts or quantizes the checkpoint and runs
trtllm-build with flags chosen per precision as TensorRT-LLM documents them, copies the tokenizer
next to the engine and writes the marker last. On pvc:// caches engines are built beside their
final directory and renamed into place, so readers (and a second Job building the same key) never
see a half-written one; for object-store caches the publish container uploads the staged engine.
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
from pathlib import Path

MARKER = "llm-operator-engine.complete"
EXIT_CONFIG = 78
CACHED = ".llm-operator-cached"  # written by engine/fetch.py: the key is in the cache already
# TensorRT-LLM's examples (convert_checkpoint.py, quantization/quantize.py): NVIDIA's tritonserver
# trtllm image does not carry them (triton-inference-server/server build.py at v2.64.0 = 25.12
# adds the backend and pip packages, no examples; NVIDIA's Triton guides run them from a clone),
# so the fetch init container copies those of the key's version into the work directory
# (LLMOP_TRTLLM_EXAMPLES). TensorRT-LLM's own release image keeps them in
# /app/tensorrt_llm/examples (NVIDIA/TensorRT-LLM docker/Dockerfile.multi, release stage: WORKDIR
# /app/tensorrt_llm, `COPY examples examples`; read on a 2025 main snapshot, not at a tag), the
# fallback for an engine.build.image of that kind.
IMAGE_EXAMPLES = "/app/tensorrt_llm/examples"
EXAMPLES = next(
    (p for p in (os.environ.get("LLMOP_TRTLLM_EXAMPLES"), IMAGE_EXAMPLES) if p and Path(p).is_dir()),
    os.environ.get("LLMOP_TRTLLM_EXAMPLES", IMAGE_EXAMPLES),
)

# precision -> ModelOpt quantize.py --qformat; fp16/bf16 go through the model's convert_checkpoint.py
QFORMAT = {"fp8": "fp8", "int8-sq": "int8_sq", "int4-awq": "int4_awq", "w4a8-awq": "w4a8_awq"}
# Hugging Face architecture -> TensorRT-LLM example directory holding its convert_checkpoint.py
FAMILY = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "MixtralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen",
    "GemmaForCausalLM": "gemma",
    "Gemma2ForCausalLM": "gemma",
    "Phi3ForCausalLM": "phi",
    "FalconForCausalLM": "falcon",
}
TOKENIZER_FILES = ("tokenizer*", "special_tokens_map.json", "generation_config.json", "config.json",
                   "vocab.*", "merges.txt")  # fmt: skip


class BuildError(Exception):
    """This image or node cannot build this key: exit EXIT_CONFIG."""


def dtype(precision: str) -> str:
    return "bfloat16" if precision == "bf16" else "float16"


def convert_script(examples: str | Path, architecture: str) -> Path:
    """convert_checkpoint.py of the model's family (examples/models/core/ since TensorRT-LLM 0.18)."""
    family = FAMILY.get(architecture)
    if family is None:
        raise BuildError(f"no TensorRT-LLM checkpoint converter known for {architecture}: "
                         f"supported are {', '.join(sorted(FAMILY))}")  # fmt: skip
    candidates = [Path(examples, "models", "core", family, "convert_checkpoint.py"),
                  Path(examples, family, "convert_checkpoint.py")]  # fmt: skip
    return next((c for c in candidates if c.exists()), candidates[0])


def convert_command(a: argparse.Namespace, model_dir: str, checkpoint: str, script: str | Path) -> list[str]:
    """Checkpoint -> TensorRT-LLM checkpoint sharded tp x pp. Quantized formats and quantized KV
    caches need calibration, which ModelOpt's quantize.py does for every supported model."""
    parallel = ["--tp_size", str(a.tp), "--pp_size", str(a.pp)]
    qformat = QFORMAT.get(a.precision)
    quant_kv = a.kv_cache_dtype in ("fp8", "int8")
    if qformat is None and not quant_kv:
        return ["python", str(script), "--model_dir", model_dir, "--output_dir", checkpoint,
                "--dtype", dtype(a.precision), *parallel]  # fmt: skip
    cmd = ["python", f"{EXAMPLES}/quantization/quantize.py", "--model_dir", model_dir,
           "--output_dir", checkpoint, "--dtype", dtype(a.precision), "--qformat", qformat or "full_prec",
           "--calib_size", "512", *parallel]  # fmt: skip
    if quant_kv:
        cmd += ["--kv_cache_dtype", a.kv_cache_dtype]
    return cmd


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


def staging(a: argparse.Namespace) -> str:
    """Where trtllm-build writes: beside the final directory (renamed into place when complete),
    or the local directory an object-store upload reads."""
    return a.output if a.upload else f"{a.output}.partial-{socket.gethostname()}"


def conversion(a: argparse.Namespace, model_dir: str, work: str, architecture: str) -> list[list[str]]:
    """Convert or quantize, then build into the staging directory."""
    checkpoint = f"{work}/checkpoint"
    script = convert_script(EXAMPLES, architecture)
    return [convert_command(a, model_dir, checkpoint, script), build_command(a, checkpoint, staging(a))]


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


def run(cmd: list[str], dry_run: bool) -> None:
    print("+", shlex.join(cmd), flush=True)
    if not dry_run:
        subprocess.run(cmd, check=True)


def architecture_of(model_dir: str | Path) -> str:
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return str((config.get("architectures") or ["?"])[0])


def model_dir(a: argparse.Namespace) -> Path:
    """Where the checkpoint is: a mounted directory as given, else the fetch container's download."""
    return Path(a.model) if a.model.startswith("/") else Path(a.work_dir, "model")


def build(a: argparse.Namespace) -> None:
    work, source = Path(a.work_dir), model_dir(a)
    if a.dry_run:  # without the checkpoint there is no config.json to name the architecture
        arch = architecture_of(source) if (source / "config.json").is_file() else "LlamaForCausalLM"
        for cmd in conversion(a, str(source), str(work), arch):
            run(cmd, dry_run=True)
        return
    check_environment(a)
    staged = Path(staging(a))
    shutil.rmtree(staged, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    try:
        for cmd in conversion(a, str(source), str(work), architecture_of(source)):
            run(cmd, dry_run=False)
        copy_tokenizer(source, staged)
        (staged / MARKER).write_text(a.key + "\n")
        if not a.upload:
            publish(staged, Path(a.output))
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the download and the converted checkpoint
        if not a.upload:
            shutil.rmtree(staged, ignore_errors=True)  # a failed attempt's partial engine


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="llm_operator.engine.build")
    for name in ("key", "model", "revision", "precision", "kv-cache-dtype", "sm", "output", "work-dir"):
        p.add_argument(f"--{name}", required=True)
    for name in ("tp", "pp", "gpus", "gpus-per-node", "max-batch-size", "max-input-len", "max-seq-len",
                 "max-num-tokens", "max-beam-width"):  # fmt: skip
        p.add_argument(f"--{name}", type=int, required=True)
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
