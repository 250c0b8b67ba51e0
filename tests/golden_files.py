"""Golden files: what a pure builder renders, pinned in tests/golden and reviewed as a diff."""

from __future__ import annotations

import os
from pathlib import Path


def assert_golden(path: Path, text: str, what: str) -> None:
    """`text` equals the golden file at `path`; with UPDATE_GOLDEN=1 it is written there first."""
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file for {what}: run with UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{what} changed: review, then UPDATE_GOLDEN=1"
