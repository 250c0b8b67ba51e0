"""requirements/*.lock read as pins. scripts/lock.sh writes each requirement with the hashes of
its files (`name==version \\` then `--hash=sha256:...` lines), which pip checks wherever a lock is
installed (--require-hashes): the environments, the Dockerfiles and images.builder."""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path

from packaging.utils import canonicalize_name

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")


def pins(lock: Path) -> dict[str, str]:
    """{canonical name (PEP 503): version} of every requirement of the lock."""
    found: dict[str, str] = {}
    for line in lock.read_text().splitlines():
        if match := _PIN.match(line):
            found[canonicalize_name(match.group(1))] = match.group(2)
    return found


def write_without(lock: Path, names: Collection[str], dest: Path) -> Path:
    """The lock at `dest` without the requirements `names` (PEP 503 names) and their hash lines;
    every other requirement keeps its hashes."""
    kept, keep = [], True
    for line in lock.read_text().splitlines(keepends=True):
        if match := _PIN.match(line):
            keep = canonicalize_name(match.group(1)) not in names
        if keep:
            kept.append(line)
    dest.write_text("".join(kept))
    return dest
