"""The store side of an engine build, run in the fetch image (images/fetch.Dockerfile), never in
NVIDIA's: `python3 -m llm_operator.engine.fetch fetch ...` (an init container before the build)
and `... publish ...` (the Job's main container after it, object-store caches only).

NVIDIA's tritonserver trtllm image has neither the AWS CLI nor gsutil: this image brings them, so
the build container runs NVIDIA's image as published. It also brings TensorRT-LLM's examples of
each release (FETCH_EXAMPLES_ROOT), which the build prefers to its image's own (`/app/examples` in
NVIDIA's, engine/build.py IMAGE_EXAMPLES; another engine.build.image may have none); a fetch image
without them copies nothing. Standard library only (it arrives by injection, like build.py). The
checkpoint is not downloaded here: the build reads it from the model cache (the model's fetch Job,
llm_operator/modelcache/) or a pvc:// source, mounted read-only.

fetch: a cache hit (the key's marker already in the cache) writes CACHED in the work directory
and does nothing else; the build and publish containers then exit at once. Otherwise it empties
the work directory and copies TensorRT-LLM's examples of the key's version, when it has them, into
`<work>/trtllm-examples`. publish: the engine's files first, its marker last, so a reader that
finds the marker finds the whole engine.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

MARKER = "llm-operator-engine.complete"  # the same file build.py writes last
CACHED = ".llm-operator-cached"  # in the work directory: the key is in the cache already
EXAMPLES_DIR = "trtllm-examples"
# Where the fetch image keeps TensorRT-LLM's examples, one directory per version (v1.1.0, ...).
FETCH_EXAMPLES_ROOT = "/opt/trtllm-examples"
EXIT_CONFIG = 78


class FetchError(Exception):
    """A URI this image cannot read or write: exit EXIT_CONFIG (retrying cannot help)."""


def upload_commands(engine: str, uri: str) -> list[list[str]]:
    """Files first, the marker last."""
    if uri.startswith("s3://"):
        return [["aws", "s3", "sync", "--only-show-errors", "--exclude", MARKER, engine, uri],
                ["aws", "s3", "cp", f"{engine}/{MARKER}", f"{uri}/{MARKER}"]]  # fmt: skip
    if uri.startswith("gs://"):
        return [["gsutil", "-m", "rsync", "-r", "-x", MARKER, engine, uri],
                ["gsutil", "cp", f"{engine}/{MARKER}", f"{uri}/{MARKER}"]]  # fmt: skip
    raise FetchError("engines are uploaded to s3:// or gs:// caches only")


def read_marker_command(uri: str) -> list[str]:
    if uri.startswith("s3://"):
        return ["aws", "s3", "cp", f"{uri}/{MARKER}", "-"]
    return ["gsutil", "cat", f"{uri}/{MARKER}"]


def cached(a: argparse.Namespace) -> bool:
    if a.upload:
        found = subprocess.run(read_marker_command(a.upload), capture_output=True, text=True)
        return found.returncode == 0 and found.stdout.strip() == a.key
    marker = Path(a.output) / MARKER
    return marker.is_file() and marker.read_text().strip() == a.key


def copy_examples(version: str | None, dest: Path, root: str = FETCH_EXAMPLES_ROOT) -> bool:
    """TensorRT-LLM's examples of `version` into dest; False when this image has none for it (the
    build then takes its image's own, /app/examples in NVIDIA's)."""
    source = Path(root, f"v{version}")
    if not version or not source.is_dir():
        return False
    shutil.copytree(source, dest)
    return True


def run(cmd: list[str]) -> None:
    print("+", shlex.join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def fetch(a: argparse.Namespace) -> None:
    work = Path(a.work_dir)
    if cached(a):
        work.mkdir(parents=True, exist_ok=True)
        (work / CACHED).write_text(a.key + "\n")
        print(f"engine {a.key} is already in the cache: nothing to fetch", flush=True)
        return
    shutil.rmtree(work, ignore_errors=True)  # a failed attempt's files
    work.mkdir(parents=True)
    if not copy_examples(a.examples_version, work / EXAMPLES_DIR):
        print(
            f"no TensorRT-LLM {a.examples_version} examples in this image: the build uses its own", flush=True
        )


def publish(a: argparse.Namespace) -> None:
    if (Path(a.work_dir) / CACHED).is_file():
        print(f"engine {a.key} is already in the cache: nothing to upload", flush=True)
        return
    for cmd in upload_commands(a.engine, a.upload):
        run(cmd)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="llm_operator.engine.fetch")
    steps = p.add_subparsers(dest="step", required=True)
    f = steps.add_parser("fetch", help="TensorRT-LLM's examples into the work directory")
    f.add_argument("--examples-version", help="TensorRT-LLM version whose examples the build runs")
    cache = f.add_mutually_exclusive_group(required=True)
    cache.add_argument("--output", help="the engine directory on a pvc:// cache")
    cache.add_argument("--upload", help="the engine directory on an s3:// or gs:// cache")
    u = steps.add_parser("publish", help="upload the built engine, marker last")
    u.add_argument("--engine", required=True)
    u.add_argument("--upload", required=True)
    for s in (f, u):
        s.add_argument("--key", required=True)
        s.add_argument("--work-dir", required=True)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    try:
        fetch(a) if a.step == "fetch" else publish(a)
    except FetchError as e:
        print(f"engine {a.step}: {e}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    except subprocess.CalledProcessError as e:
        print(f"engine {a.step}: {shlex.join(e.cmd)} exited {e.returncode}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
