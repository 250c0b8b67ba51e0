"""requirements/*.lock read as pins. scripts/lock.sh writes each requirement with the hashes of
its files (`name==version \\` then `--hash=sha256:...` lines), which pip checks when the
environments are made (--require-hashes). The image builder takes the versions only: its wheels
come from a constraints file of plain `name==version` lines, since pip's hash-checking mode would
also demand hashes for the project's own freshly built wheel."""

from __future__ import annotations

import re
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


def write_constraints(lock: Path, dest: Path) -> Path:
    """The lock as a constraints file without hashes, at `dest`."""
    dest.write_text("".join(f"{name}=={version}\n" for name, version in sorted(pins(lock).items())))
    return dest
