"""Golden files: what a pure builder renders, pinned in tests/golden and reviewed as a diff."""

from __future__ import annotations

import os
from pathlib import Path

# The launcher image's tag in goldens, in place of the content hash of the injected files
# (llm_operator/inject.py), which every edit to the launcher or the front door would change in every
# golden; tests/unit/test_launcher_tag.py holds the real tag's behaviour.
LAUNCHER_TAG = "content-hash"


def pinned_launcher_tag(package: Path | None = None) -> str:
    """What goldens render in place of inject.content_tag (monkeypatched in)."""
    return LAUNCHER_TAG


def assert_golden(path: Path, text: str, what: str) -> None:
    """`text` equals the golden file at `path`; with UPDATE_GOLDEN=1 it is written there first."""
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file for {what}: run with UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{what} changed: review, then UPDATE_GOLDEN=1"
