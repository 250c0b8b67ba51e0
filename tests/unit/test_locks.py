"""The Python locks pin every file by hash, and every environment is made hash-checked.

scripts/lock.sh writes requirements/*.lock with the sha256 of each file PyPI has for a pinned
version; scripts/ensure-venv.sh and ensure-tool-venv.sh install them with --require-hashes, pip
itself included, so a changed file on the index fails the install instead of running in CI."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from images.builder import locks

REPO = Path(__file__).resolve().parents[2]
LOCKS = sorted((REPO / "requirements").glob("*.lock"))
REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+) \\$")
HASH = re.compile(r"^    --hash=sha256:[0-9a-f]{64}( \\)?$")


@pytest.mark.parametrize("lock", LOCKS, ids=[p.stem for p in LOCKS])
def test_every_requirement_is_pinned_with_the_hashes_of_its_files(lock: Path) -> None:
    lines = [line for line in lock.read_text().splitlines() if line and not line.startswith("#")]
    assert lines, f"{lock.name} is empty"
    requirement = None
    hashes: dict[str, int] = {}
    for line in lines:
        if match := REQUIREMENT.match(line):
            requirement = match.group(1)
            hashes[requirement] = 0
        else:
            assert HASH.match(line), f"{lock.name}: not a pin or a sha256 hash: {line!r}"
            assert requirement is not None, f"{lock.name}: a hash before any requirement"
            hashes[requirement] += 1
    assert all(hashes.values()), f"{lock.name}: without hashes: {[n for n, c in hashes.items() if not c]}"
    assert set(locks.pins(lock)) == {canonicalize_name(n) for n in hashes}


@pytest.mark.parametrize("script", ["ensure-venv.sh", "ensure-tool-venv.sh"])
def test_environments_are_installed_hash_checked_pip_first(script: Path) -> None:
    lines = (REPO / "scripts" / script).read_text().splitlines()
    installs = [line for line in lines if 'pip" install' in line and " -r " in line]  # not the editable -e .
    assert installs and all("--require-hashes" in line and "--no-deps" in line for line in installs), installs
    assert "requirements/pip.lock" in installs[0], "pip itself comes first, from its own lock"


def test_the_image_builder_reads_versions_from_the_hashed_lock(tmp_path: Path) -> None:
    pinned = locks.pins(REPO / "requirements" / "dev.lock")
    assert pinned["tokenizers"] and pinned["markupsafe"], "names are normalized (MarkupSafe)"
    constraints = locks.write_constraints(REPO / "requirements" / "dev.lock", tmp_path / "c.txt").read_text()
    assert "--hash" not in constraints and f"tokenizers=={pinned['tokenizers']}\n" in constraints
