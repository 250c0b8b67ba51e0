"""The state directory of one embedded cluster (default: <repo>/.cluster) and the lock on it.

Layout: pki/, kubeconfig (admin), kubeconfigs/<component>.kubeconfig, env, bin/ (kubectl and helm
links), run/<component>.pid, logs/<component>.log, etcd/, node/ (the real node's configs, kubelet
root, containerd root, pod logs), leases/<pid> (test sessions using the cluster), cluster.json
(ports, binaries, add-ons, pinned). Outside it, named by a hash of its path: the network namespace
/run/netns/llmop-<key>, the node's sockets and runtime state /run/llmop-<key>/, and the cgroup
/sys/fs/cgroup/<hierarchy>/llmop-<key>/. Kept across `down`, in the cache dir: the node's
containerd root, <cache>/node/<key>/containerd (imported images).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from e2e.cluster.processes import running

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_STATE_DIR = REPO_ROOT / ".cluster"
CACHE_DIR = Path(os.environ.get("LLMOP_CACHE", Path.home() / ".cache" / "llm-operator"))


def shown(path: Path) -> str:
    """Path as the user typed it where possible (shorter one-line errors)."""
    with contextlib.suppress(ValueError):
        return str(path.relative_to(Path.cwd()))
    return str(path)


def cluster_name(key: str) -> str:
    """The netns, the cgroup and the /run dir of the cluster of state-dir key `key`."""
    return f"llmop-{key}"


class StateDir:
    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()

    @property
    def key(self) -> str:
        """Short and unique per state dir: names the netns, the cgroup and the /run dir."""
        return hashlib.sha256(str(self.root).encode()).hexdigest()[:8]

    @property
    def netns(self) -> str:
        return cluster_name(self.key)

    @property
    def node_dir(self) -> Path:
        return self.root / "node"

    @property
    def node_cache(self) -> Path:
        """What the real node keeps across `down` (containerd's root: the images imported)."""
        return CACHE_DIR / "node" / self.key

    @property
    def run_dir(self) -> Path:
        return Path("/run") / cluster_name(self.key)

    @property
    def cgroup(self) -> str:
        return cluster_name(self.key)

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    @property
    def env_file(self) -> Path:
        return self.root / "env"

    @property
    def pki_dir(self) -> Path:
        return self.root / "pki"

    @property
    def etcd_dir(self) -> Path:
        return self.root / "etcd"

    @property
    def _meta_file(self) -> Path:
        return self.root / "cluster.json"

    def component_kubeconfig(self, component: str) -> Path:
        return self.root / "kubeconfigs" / f"{component}.kubeconfig"

    def log_file(self, component: str) -> Path:
        return self.root / "logs" / f"{component}.log"

    def pid_file(self, component: str) -> Path:
        return self.root / "run" / f"{component}.pid"

    def _lease(self, session: int) -> Path:
        return self.root / "leases" / str(session)

    @property
    def lock_file(self) -> Path:
        """Outside the state dir (which `down` deletes) so concurrent up/down calls serialize;
        named by a longer prefix of the hash that `key` is."""
        return (
            CACHE_DIR / "locks" / f"cluster-{hashlib.sha256(str(self.root).encode()).hexdigest()[:16]}.lock"
        )

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        path = self.lock_file
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    def create(self, ports: Mapping[str, int], tools: Mapping[str, Path]) -> None:
        """The directories a fresh start writes into, and its cluster.json."""
        for sub in ("run", "logs", "kubeconfigs", "bin", "etcd"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        meta = {"ports": dict(ports), "tools": {k: str(v) for k, v in tools.items()}}
        self._meta_file.write_text(json.dumps(meta, indent=2))

    def record(self, ports: Mapping[str, int], tools: Mapping[str, Path], addons: list[str]) -> None:
        """What a start or an added add-on changed: the host ports, the binaries (merged), the
        add-ons running."""
        meta = self.meta()
        meta["ports"] = dict(ports)
        meta["tools"] = {**meta.get("tools", {}), **{k: str(v) for k, v in tools.items()}}
        meta["addons"] = list(dict.fromkeys(addons))
        self._meta_file.write_text(json.dumps(meta, indent=2))

    def addons(self, before_addons: tuple[str, ...] = ()) -> list[str]:
        """The add-ons (addons.py) this cluster runs; `before_addons` for a cluster started before
        there were add-ons (its cluster.json names none: it runs what they are now)."""
        found: list[str] = self.meta().get("addons", list(before_addons))
        return found

    def meta(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self._meta_file.read_text())
        except (OSError, ValueError):
            return {}
        return data

    def ports(self) -> dict[str, int]:
        ports: dict[str, int] = self.meta().get("ports", {})
        return ports

    def read_pid(self, component: str) -> int | None:
        try:
            return int(self.pid_file(component).read_text().strip())
        except (OSError, ValueError):
            return None

    def write_pid(self, component: str, pid: int) -> None:
        self.pid_file(component).write_text(f"{pid}\n")

    def claim(self, session: int | None) -> None:
        """A session's lease, or (no session: a person's `up`) pin the cluster until `down`."""
        if session is None:
            self._meta_file.write_text(json.dumps({**self.meta(), "pinned": True}, indent=2))
        else:
            self._lease(session).parent.mkdir(exist_ok=True)
            self._lease(session).touch()

    def drop_lease(self, session: int) -> None:
        self._lease(session).unlink(missing_ok=True)

    def in_use(self) -> bool:
        """Pinned, or leased by a session that is still running."""
        leases = self.root / "leases"
        live = [p for p in leases.iterdir() if running(int(p.name))] if leases.is_dir() else []
        return bool(self.meta().get("pinned") or live)

    def clear(self, keep: tuple[str, ...] = ()) -> None:
        """Remove the state dir, or all of it but the entries named in `keep`."""
        if not self.root.exists():
            return
        for child in self.root.iterdir():
            if child.name in keep:
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        if not keep:
            self.root.rmdir()
