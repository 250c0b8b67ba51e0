"""The build cache, outside the repository: ${LLMOP_CACHE:-~/.cache/llm-operator}/images.

Everything in it is written under a temporary name and renamed into place, so an interrupted build
leaves only a hidden `.*.tmp` leftover (swept by the next build), never a half archive that a later
build would reuse.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path

SKIPPED = ("__pycache__", ".pyc", ".egg-info")  # build by-products next to sources


def cache_root() -> Path:
    return Path(os.environ.get("LLMOP_CACHE", "~/.cache/llm-operator")).expanduser() / "images"


def _tmp_name(dest: Path) -> Path:
    return dest.with_name(f".{dest.name}.{os.getpid()}.tmp")


@contextlib.contextmanager
def atomic_path(dest: Path) -> Iterator[Path]:
    """Yield a temporary path for a file or directory that becomes dest only if the block succeeds."""
    tmp = _tmp_name(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        yield tmp
        if tmp.is_file():
            with tmp.open("rb") as written:
                os.fsync(written.fileno())
        os.replace(tmp, dest)
    finally:
        remove(tmp)


@contextlib.contextmanager
def scratch(name: str) -> Iterator[Path]:
    """A work directory in the cache (same filesystem as the results: renames stay atomic, hard
    links work), removed afterwards."""
    path = _tmp_name(cache_root() / name)
    path.mkdir(parents=True)
    try:
        yield path
    finally:
        remove(path)


def remove(path: Path) -> None:
    """Remove a file or tree; a failed debootstrap may leave /proc or /sys mounted in its target,
    so those are unmounted first and rm never crosses into another filesystem."""
    if not path.is_dir() or path.is_symlink():
        path.unlink(missing_ok=True)
        return
    prefix = f"{path.resolve()}/"
    with open("/proc/self/mountinfo") as mountinfo:
        mounts = [line.split()[4] for line in mountinfo if line.split()[4].startswith(prefix)]
    for mount in sorted(mounts, reverse=True):
        subprocess.run(["umount", "--lazy", mount], check=True)
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=True)


@contextlib.contextmanager
def build_lock() -> Iterator[None]:
    """One build at a time per cache (two cores gain nothing from more); the holder sweeps what
    killed builds left behind."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for stale in stale_temporaries(root):
            remove(stale)
        yield


def stale_temporaries(root: Path) -> list[Path]:
    """What killed builds left (`.*.tmp`, files or trees). Pushes run outside the build lock and
    unpack into `.push-*` directories they remove themselves: those are not walked, and a tree
    that vanishes during the walk is skipped (os.walk ignores it; Path.rglob raised)."""
    found = []
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = [d for d in subdirectories if not d.startswith(".push-")]
        here = Path(directory)
        for name in [*subdirectories, *files]:
            if name.startswith(".") and name.endswith(".tmp"):
                found.append(here / name)
        subdirectories[:] = [d for d in subdirectories if not d.endswith(".tmp")]
    return found


def keep_recent(directory: Path, name: re.Pattern[str], keep: int) -> list[Path]:
    """Remove all but the `keep` most recently used files whose names match `name` (a build marks
    what it reuses as used: its mtime), with the files named after them (an archive's SBOMs), so the
    cache holds a few checkouts' builds rather than every build it ever made. Returns the removed."""
    matching = [p for p in directory.glob("*") if p.is_file() and name.fullmatch(p.name)]
    matching.sort(key=lambda p: p.stat().st_mtime_ns, reverse=True)
    removed = []
    for old in matching[keep:]:
        for path in [old, *directory.glob(f"{glob_escape(old.name)}.*")]:
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def files_under(root: Path, *relative: str) -> list[Path]:
    """The files an image copies from the checkout, sorted, without build by-products."""
    found: list[Path] = []
    for rel in relative:
        path = root / rel
        candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        found += [p for p in candidates if not any(part.endswith(SKIPPED) for part in p.parts)]
    return found


def inputs_hash(parts: Iterable[tuple[str, bytes]]) -> str:
    """sha256 over named parts (file paths, package lists, settings), order-independent."""
    sha = hashlib.sha256()
    for name, data in sorted(parts):
        sha.update(f"{name}\0{len(data)}\0".encode())
        sha.update(data)
    return sha.hexdigest()
