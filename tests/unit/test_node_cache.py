"""Which node caches `up` and `down` prune (e2e/cluster/node_cache.py): other clusters' whose
checkout is gone or that went unused, never the current one, one in use or one whose lock is held."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from e2e.cluster import node_cache
from e2e.cluster.state import StateDir

DAY = 24 * 3600


def cache_of(cache_dir: Path, state: StateDir, age_s: float = 0) -> Path:
    """The node cache of `state` under `cache_dir`, marked by an `up` `age_s` ago."""
    cache = cache_dir / "node" / state.key
    (cache / "containerd").mkdir(parents=True)
    (cache / node_cache.OWNER).write_text(f'{{"stateDir": "{state.root}"}}')
    then = time.time() - age_s
    os.utime(cache / node_cache.OWNER, (then, then))
    return cache


def test_only_the_caches_of_gone_or_unused_clusters_go(tmp_path: Path) -> None:
    cache_dir, work = tmp_path / "cache", tmp_path / "wt"
    checkouts = {name: work / name for name in ("current", "sibling", "idle", "removed", "running")}
    for name, checkout in checkouts.items():
        if name != "removed":
            checkout.mkdir(parents=True)
    states = {name: StateDir(checkout / ".cluster") for name, checkout in checkouts.items()}
    caches = {
        "current": cache_of(cache_dir, states["current"], age_s=30 * DAY),  # however old: warm
        "sibling": cache_of(cache_dir, states["sibling"], age_s=DAY),
        "idle": cache_of(cache_dir, states["idle"], age_s=3 * DAY),
        "removed": cache_of(cache_dir, states["removed"]),
        "running": cache_of(cache_dir, states["running"], age_s=30 * DAY),
    }
    # Caches from before OWNER: the time of their top two levels.
    legacy, legacy_used = cache_dir / "node" / "0123abcd", cache_dir / "node" / "4567cdef"
    for cache in (legacy, legacy_used):
        (cache / "containerd" / "io.containerd.content.v1.content").mkdir(parents=True)
        for path in (cache, cache / "containerd", cache / "containerd" / "io.containerd.content.v1.content"):
            os.utime(path, (time.time() - 3 * DAY,) * 2)
    os.utime(legacy_used / "containerd" / "io.containerd.content.v1.content")  # an image pulled today

    def in_use(key: str, cache: Path) -> bool:
        return key == states["running"].key

    removed = node_cache.prune(states["current"], cache_dir, in_use=in_use)
    assert sorted(removed) == sorted([caches["idle"], caches["removed"], legacy])
    assert all(caches[name].is_dir() for name in ("current", "sibling", "running")) and legacy_used.is_dir()


def test_a_cache_whose_cluster_holds_its_lock_stays(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    gone = StateDir(tmp_path / "removed" / ".cluster")
    cache = cache_of(cache_dir, gone)
    lock = cache_dir / "locks" / gone.lock_file.name
    lock.parent.mkdir(parents=True)
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # its `up` or `down` under way
        assert node_cache.prune(StateDir(tmp_path / ".cluster"), cache_dir, in_use=lambda *_: False) == []
    assert cache.is_dir()
    assert node_cache.prune(StateDir(tmp_path / ".cluster"), cache_dir, in_use=lambda *_: False) == [cache]


def test_a_running_cluster_is_seen_by_its_network_namespace_run_dir_or_mounts(tmp_path: Path) -> None:
    assert not node_cache.running("00000000", tmp_path)
    run_dir = Path("/run") / "llmop-test-node-cache"
    if os.access("/run", os.W_OK):
        run_dir.mkdir(exist_ok=True)
        try:
            assert node_cache.running("test-node-cache", tmp_path)
        finally:
            run_dir.rmdir()
