"""The real nodes' caches, <cache>/node/<key> (containerd's root, the registry's blobs, the stores'
seed), one per state dir and kept across `down` so that the next `up` pushes and pulls nothing.
Checkouts come and go, each leaving gigabytes there: `up` and `down` prune the caches of other
clusters that are gone.

A cache is in use, and kept, while its cluster runs (its network namespace or its /run dir exists,
or something is mounted below the cache) or while its up/down lock is held: sibling checkouts run
their clusters beside this one. Otherwise it goes when the checkout of its state dir no longer
exists (OWNER, written at each `up`, names the state dir), or when its cluster was last brought up
more than MAX_AGE_S ago (a cache from before OWNER: when its top two levels last changed).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from e2e.cluster import netns
from e2e.cluster.node import mounts_under
from e2e.cluster.state import CACHE_DIR, StateDir, cluster_name

OWNER = "owner.json"
MAX_AGE_S = 2 * 24 * 3600


def mark(state: StateDir) -> None:
    """Name the state dir in its cache; the file's time is the cluster's last `up`."""
    state.node_cache.mkdir(parents=True, exist_ok=True)
    (state.node_cache / OWNER).write_text(json.dumps({"stateDir": str(state.root)}))


def running(key: str, cache: Path) -> bool:
    """Whether the cluster of `key` runs: what `up` creates and `down` removes, by key."""
    return (
        netns.exists(cluster_name(key))
        or (Path("/run") / cluster_name(key)).exists()
        or bool(mounts_under([cache]))
    )


def prune(
    current: StateDir,
    cache_dir: Path = CACHE_DIR,
    max_age_s: float = MAX_AGE_S,
    in_use: Callable[[str, Path], bool] = running,
) -> list[Path]:
    """Remove the node caches other than `current`'s whose checkout is gone or that are older than
    `max_age_s`, unless in use; returns those removed."""
    removed = []
    root = cache_dir / "node"
    for cache in sorted(root.iterdir()) if root.is_dir() else []:
        if not cache.is_dir() or cache.name == current.key:
            continue
        owner = _owner(cache)
        gone = owner is not None and not owner.parent.exists()
        if not gone and time.time() - _last_used(cache) <= max_age_s:
            continue
        with _locked(cache_dir, cache.name, owner) as free:
            if free and not in_use(cache.name, cache):
                shutil.rmtree(cache, ignore_errors=True)
                removed.append(cache)
    return removed


def _last_used(cache: Path) -> float:
    """When OWNER was written; for a cache without it, when it or what is two levels below it
    last changed (containerd's and the registry's directories change as images come and go)."""
    if (cache / OWNER).exists():
        return (cache / OWNER).stat().st_mtime
    paths = [cache, *cache.iterdir()]
    paths += [p for child in paths[1:] if child.is_dir() for p in child.iterdir()]
    return max(p.lstat().st_mtime for p in paths)


def _owner(cache: Path) -> Path | None:
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return Path(json.loads((cache / OWNER).read_text())["stateDir"])
    return None


@contextlib.contextmanager
def _locked(cache_dir: Path, key: str, owner: Path | None) -> Iterator[bool]:
    """Hold the up/down locks of cluster `key` (StateDir.lock_file: found by `key`, and the owner's
    created, so that an `up` starting now waits for the removal); yields False when one is held."""
    locks = cache_dir / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    paths = set(locks.glob(f"cluster-{key}*.lock"))
    if owner is not None:
        paths.add(locks / StateDir(owner).lock_file.name)
    with contextlib.ExitStack() as stack:
        for path in sorted(paths):
            f = stack.enter_context(path.open("a"))
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
        yield True
