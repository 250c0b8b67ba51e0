"""What an engine-build Job runs: `python -m llm_operator.engine.build ARGS` (args from build_job).

Skips the work when the output directory already holds a complete engine for this key (a marker
written last), otherwise converts or quantizes the checkpoint and runs trtllm-build with flags
chosen per precision as TensorRT-LLM documents them, then writes the marker. `--dry-run` prints
the commands instead of running them.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

MARKER = "llm-operator-engine.complete"
CHECKPOINT = "/tmp/checkpoint"
MODEL_DIR = "/tmp/model"

# precision -> ModelOpt quantize.py --qformat (None: plain convert_checkpoint.py)
QFORMAT = {"fp16": None, "bf16": None, "fp8": "fp8", "int8-sq": "int8_sq", "int4-awq": "int4_awq",
           "w4a8-awq": "w4a8_awq"}  # fmt: skip


def convert_command(a: argparse.Namespace, model_dir: str) -> list[str]:
    dtype = "bfloat16" if a.precision == "bf16" else "float16"
    qformat = QFORMAT[a.precision]
    parallel = ["--tp_size", str(a.tp), "--pp_size", str(a.pp)]
    if qformat is None:
        return ["python", "/app/examples/llama/convert_checkpoint.py", "--model_dir", model_dir,
                "--output_dir", CHECKPOINT, "--dtype", dtype, *parallel]  # fmt: skip
    cmd = ["python", "/app/examples/quantization/quantize.py", "--model_dir", model_dir,
           "--output_dir", CHECKPOINT,
           "--dtype", dtype, "--qformat", qformat, "--calib_size", "512", *parallel]  # fmt: skip
    if a.kv_cache_dtype in ("fp8", "int8"):
        cmd += ["--kv_cache_dtype", a.kv_cache_dtype]
    return cmd


def build_command(a: argparse.Namespace) -> list[str]:
    fp8 = a.precision in ("fp8", "w4a8-awq")
    cmd = [
        "trtllm-build", "--checkpoint_dir", CHECKPOINT, "--output_dir", a.output,
        "--max_batch_size", str(a.max_batch_size), "--max_input_len", str(a.max_input_len),
        "--max_seq_len", str(a.max_seq_len), "--max_num_tokens", str(a.max_num_tokens),
        "--max_beam_width", str(a.max_beam_width), "--kv_cache_type", "paged",
        "--gpt_attention_plugin", "auto", "--remove_input_padding", "enable",
        # Paged context FMHA: needed by KV-cache reuse and chunked context.
        "--use_paged_context_fmha", "enable", "--workers", str(a.tp * a.pp),
    ]  # fmt: skip
    # GEMM plugin helps fp16/bf16; FP8 GEMMs run faster without it.
    cmd += ["--gemm_plugin", "disable" if fp8 else "auto"]
    if fp8 and a.sm.startswith("sm9"):
        cmd += ["--use_fp8_context_fmha", "enable"]  # Hopper FP8 attention
    return cmd


def fetch_command(uri: str, revision: str, model_dir: str) -> list[str]:
    """Download the checkpoint with the tool the builder image ships for that store."""
    scheme, _, path = uri.partition("://")
    if scheme == "s3":
        return ["aws", "s3", "sync", uri, model_dir]
    if scheme == "gs":
        return ["gcloud", "storage", "rsync", "--recursive", uri, model_dir]
    if scheme == "hf":
        return [
            "huggingface-cli",
            "download",
            path.strip("/"),
            "--revision",
            revision,
            "--local-dir",
            model_dir,
        ]
    raise ValueError(f"the engine builder cannot fetch {uri!r}: use s3://, gs:// or hf://")


def commands(a: argparse.Namespace) -> list[list[str]]:
    return [
        fetch_command(a.model, a.revision, MODEL_DIR),
        convert_command(a, MODEL_DIR),
        build_command(a),
    ]


TOKENIZER_FILES = ("tokenizer*", "special_tokens_map.json", "generation_config.json")


def copy_tokenizer(model_dir: str | Path, output: str | Path) -> None:
    """Serving reads the tokenizer next to the engine (tokenizer_dir = <engine>/tokenizer)."""
    dest = Path(output) / "tokenizer"
    dest.mkdir(parents=True, exist_ok=True)
    for pattern in TOKENIZER_FILES:
        for f in Path(model_dir).glob(pattern):
            shutil.copy(f, dest / f.name)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="llm_operator.engine.build")
    for name in ("model", "revision", "precision", "kv-cache-dtype", "sm", "output", "key"):
        p.add_argument(f"--{name}", required=True)
    for name in (
        "tp",
        "pp",
        "max-batch-size",
        "max-input-len",
        "max-seq-len",
        "max-num-tokens",
        "max-beam-width",
    ):
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--dry-run", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    marker = Path(a.output) / MARKER
    if marker.exists() and marker.read_text().strip() == a.key:
        print(f"engine {a.key} already in the cache at {a.output}: nothing to build")
        return 0
    for cmd in commands(a):
        print("+", shlex.join(cmd), flush=True)
        if not a.dry_run:
            subprocess.run(cmd, check=True)
    if not a.dry_run:
        copy_tokenizer(MODEL_DIR, a.output)
        marker.write_text(a.key + "\n")  # last: a half-written engine is never taken as built
    return 0


if __name__ == "__main__":
    sys.exit(main())
