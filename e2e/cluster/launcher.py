"""Starts and stops the embedded cluster: real etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok and one real node (containerd, kubelet, kube-proxy, CoreDNS) as detached local
processes inside a private network namespace, the API server forwarded to the host's 127.0.0.1
(see docs/development.md).

This module decides what `up`, `down`, `status` and a session's release do; the state directory
is state.py, the components and their start order components.py, the processes processes.py.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.cluster import addons as addons_mod
from e2e.cluster import artifacts, containerd_images, monitoring, netns, node_cache, pki, registry
from e2e.cluster import node as node_mod
from e2e.cluster import nodes as node_pools
from e2e.cluster.components import (
    COMPONENTS,
    CORE,
    STARTUP_TIMEOUT_S,
    Log,
    extend,
    node_layout,
    run_build_tools,
    start,
)
from e2e.cluster.processes import Children, find_owned, in_background, owned_by, proc_args, rss_kib
from e2e.cluster.readiness import Api, ClusterError, create_nodes, node_ready, nodes_ready, wait
from e2e.cluster.state import DEFAULT_STATE_DIR, StateDir
from images.push import Crane

__all__ = ["DEFAULT_STATE_DIR", "RESTARTABLE", "Cluster", "ClusterError", "UpReport"]

RESTARTABLE = ("etcd", "kube-apiserver")  # what Cluster.restart() may stop and start again


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class UpReport:
    # Time to start (or verify) the cluster, excluding build-tools.sh.
    seconds: float
    already_running: bool
    # tool -> seconds, for every tool build-tools.sh had to build in this call.
    builds: dict[str, int] = field(default_factory=dict)
    build_seconds: float = 0.0
    rss_kib: dict[str, int] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    # The add-ons running (addons.py), and those this call started in a running cluster.
    addons: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)


class Cluster:
    """The embedded control plane rooted at `state_dir`.

    `up()` is idempotent: on a healthy cluster it only re-checks health (and re-creates missing
    node-pool nodes); on half-dead state it stops whatever is left and starts fresh. `down()` stops
    every process and removes the state directory. Failures raise ClusterError with one line that
    names the component and its log file, after stopping everything this call started.

    `extra_args` appends flags per component (later flags win), `tools` replaces the binaries that
    build-tools.sh would provide ({binary name: path}); both exist for tests and experiments.
    `node_images` names the images.builder images the real node has at `up` (the sandbox image
    always; the router's come with the routing add-on), built while build-tools.sh builds, pushed to
    the test registry and pulled from it; they stay in `node_cache` (containerd's root, the
    registry's blobs) across `down`.
    """

    def __init__(
        self,
        state_dir: Path = DEFAULT_STATE_DIR,
        *,
        extra_args: Mapping[str, Sequence[str]] | None = None,
        tools: Mapping[str, Path] | None = None,
        node_pools_file: Path = node_pools.NODE_POOLS_FILE,
        node_images: Sequence[str] = containerd_images.NODE_IMAGES,
        log: Log = _stderr,
    ) -> None:
        self._state = StateDir(state_dir)
        self.extra_args = {k: list(v) for k, v in (extra_args or {}).items()}
        self.tools = dict(tools) if tools is not None else None
        self.node_pools_file = node_pools_file
        self.node_images = tuple(node_images)
        self.log = log
        self._children = Children()

    @property
    def state_dir(self) -> Path:
        return self._state.root

    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig (system:masters) for kubectl, helm and tests."""
        return self._state.kubeconfig

    @property
    def netns(self) -> str:
        """Name of the cluster's network namespace (/run/netns/<name>)."""
        return self._state.netns

    @property
    def bin_dir(self) -> Path:
        """Holds kubectl and helm (links into the build cache)."""
        return self._state.bin_dir

    def log_file(self, component: str) -> Path:
        return self._state.log_file(component)

    @property
    def prometheus_url(self) -> str:
        """Prometheus as the host reaches it (its forwarder on 127.0.0.1)."""
        return f"http://127.0.0.1:{self._state.ports().get('prometheus')}"

    @property
    def gateway_url(self) -> str:
        """The Gateway's HTTP listener as the host reaches it (its forwarder on 127.0.0.1)."""
        return f"http://127.0.0.1:{self._state.ports().get('gateway')}"

    @property
    def stores(self) -> artifacts.Stores:
        """The model stores' endpoints (inside the namespace), keys and access logs."""
        return artifacts.load(self._state.root / "stores")

    def up(self, *, session: int | None = None, addons: Sequence[str] = ()) -> UpReport:
        """Start (or verify) the cluster: the core, and the add-ons named in `addons` (addons.py;
        a running cluster that lacks some gets them, built first if they never were).

        session: pid of a test session borrowing the cluster; it holds a lease until release().
        A cluster first brought up by a session is stopped when the last live lease is released;
        `up` without a session (a person, `make cluster-up`) pins it until `down`.
        """
        wanted = addons_mod.named(addons)
        begin = time.monotonic()
        with self._state.lock():
            if self._healthy():
                missing = [a for a in wanted if a.name not in self._addons()]
                builds: dict[str, int] = {}
                build_seconds = 0.0
                if missing:
                    tools, builds, build_seconds = self._build([a.name for a in missing])
                    extend(self._state, tools, self._children, self.log, missing, self.extra_args)
                api, nodes = self._api(), self._nodes()
                create_nodes(api, nodes)
                wait("node-pool nodes Ready", lambda: nodes_ready(api, nodes), 30.0, self._children)
                self._state.claim(session)
                seconds = time.monotonic() - begin - build_seconds
                return UpReport(seconds, True, builds, build_seconds, self._rss(), self._state.ports(),
                                self._addons(), [a.name for a in missing])  # fmt: skip
            # Half-dead or stopped: start from scratch (no old etcd data), keeping the leases of
            # sessions that were using the old instance and will use this one.
            self._stop_all()
            self._state.clear(keep=("leases",))
            node_cache.mark(self._state)
            self._prune_caches()
            archives: Callable[[], tuple[list[Path], str]] = functools.partial(
                containerd_images.node_archives, self.state_dir, self.log, self.node_images
            )
            if self.tools is None:  # the images build while build-tools.sh compiles: I/O beside CPU
                archives = in_background(archives, name="node-images")
            tools, builds, build_seconds = self._build(["core", *(a.name for a in wanted)])
            try:
                ports = start(
                    self._state, tools, self._children, self._nodes(), self.extra_args, self.log,
                    archives, wanted,
                )  # fmt: skip
            except BaseException:
                self._stop_all()
                self._state.clear(keep=("logs", "leases"))  # the error names a log: keep it
                raise
            self._state.claim(session)
            seconds = time.monotonic() - begin - build_seconds
            return UpReport(seconds, False, builds, build_seconds, self._rss(), ports, self._addons())

    def _build(self, groups: Sequence[str]) -> tuple[dict[str, Path], dict[str, int], float]:
        """build-tools.sh's `groups` (or the tools given to the constructor): the binaries, the
        tools it had to build with their seconds, and the seconds it took in all."""
        if self.tools is not None:
            return self.tools, {}, 0.0
        start_time = time.monotonic()
        tools, builds = run_build_tools(self.log, groups=groups)
        return tools, builds, time.monotonic() - start_time

    def import_image(self, archive: Path) -> list[str]:
        """Put an OCI image archive (e.g. busybox_image's) on the real node the way `up` puts the
        node's images there: pushed to the test registry, pulled by containerd through its
        registry host configuration. Pods then use it by name (IfNotPresent or Never). Returns its
        names."""
        self.push_images([archive])
        refs = containerd_images.archive_refs(archive)
        try:
            containerd_images.pull_missing(node_layout(self._state), self.netns, refs, self.log)
        except (RuntimeError, OSError) as e:
            raise ClusterError(str(e)) from None
        return list(refs)

    def push_images(self, archives: Sequence[Path], version: str | None = None) -> list[str]:
        """Push archives to the running test registry under the names the node pulls and the
        default image names resolve to (registry.push_refs); returns the names pushed."""
        if not self._healthy():
            raise ClusterError(f"no running cluster in {self.state_dir} to push images to")
        crane = Path(self._state.meta()["tools"]["crane"])
        try:
            pushed = registry.push_images(self._state, crane, archives, self.log, version)
            # The node's copies of default names that now name another build (IfNotPresent).
            containerd_images.drop_moved(node_layout(self._state), registry.default_names(archives, version))
        except (RuntimeError, OSError, ValueError) as e:
            raise ClusterError(str(e)) from None
        return pushed

    def registry_crane(self) -> Crane:
        """crane for the test registry (inside the namespace, as its push account)."""
        crane = Path(self._state.meta()["tools"]["crane"])
        return registry.crane(
            crane, self._state.root / "registry", pki.paths(self._state.pki_dir).ca.cert, self.netns
        )

    @property
    def registry_passwords(self) -> registry.Passwords:
        """The test registry's passwords, new at each `up` (registry.PUSH_USER's and NODE_USER's)."""
        return registry.passwords(self._state.root / "registry")

    @property
    def registry_env(self) -> dict[str, str]:
        """What crane and helm need to talk to the test registry (registry.HOST) from inside the
        cluster's namespace (`netns.command`): the push account and the cluster CA."""
        return registry.client_env(self._state.root / "registry", pki.paths(self._state.pki_dir).ca.cert)

    def restart(self, component: str) -> float:
        """Stop one control-plane process (SIGTERM, as an upgrade or a crash-looping pod would) and
        start it again with the same command line; returns the seconds until the API server was
        ready again. For fault tests: the other components, the nodes and the data stay."""
        if component not in RESTARTABLE:
            raise ValueError(f"restart supports {', '.join(RESTARTABLE)}, not {component}")
        with self._state.lock():
            pid = self._state.read_pid(component)
            if not self._healthy() or pid is None:
                raise ClusterError(f"no healthy cluster in {self.state_dir} to restart {component} in")
            argv = proc_args(pid)  # the program itself: nsenter exec'd it
            begin = time.monotonic()
            self._children.terminate([pid])
            log = self._state.log_file(component)
            self._state.write_pid(
                component,
                self._children.spawn(component, netns.command(self.netns, argv), log, self.state_dir),
            )
            api = self._api()
            ready = "kube-apiserver /readyz after restarting " + component
            wait(
                ready, lambda: api.request("GET", "/readyz")[0] == 200, STARTUP_TIMEOUT_S, self._children, log
            )
            return time.monotonic() - begin

    def container_task(self, container_id: str, action: str, *flags: str) -> None:
        """`ctr tasks ACTION [FLAGS] ID` on the real node's containerd, for fault tests: `kill
        --signal SIGSTOP` (a program that hangs), `kill --signal SIGKILL` (one that dies, for the
        kubelet to restart), `pause`/`resume` (a whole container frozen: its probes time out).
        `container_id`: a pod's containerStatuses[].containerID, with or without containerd://."""
        task = container_id.removeprefix("containerd://")
        proc = containerd_images.ctr(node_layout(self._state), "tasks", action, *flags, task, timeout=30)
        if proc.returncode != 0:
            words = (proc.stderr or proc.stdout).strip()
            raise ClusterError(f"ctr tasks {' '.join((action, *flags, task))}: {words}")

    def release(self, session: int) -> bool:
        """Drop a session's lease; stop the cluster if it is not pinned and no live session holds
        it any more. Returns True if it was stopped."""
        with self._state.lock():
            self._state.drop_lease(session)
            if self._state.in_use() or not self.state_dir.exists():
                return False
            self._stop_all()
            self._state.clear()
            return True

    @property
    def node_cache(self) -> Path:
        """The real node's containerd root (its images), kept across `down`."""
        return self._state.node_cache

    def down(self, *, keep_images: bool = True) -> list[str]:
        """Stop everything and remove the state directory (and, unless `keep_images`, the node's
        imported images); returns the components that were running."""
        with self._state.lock():
            stopped = self._stop_all()
            self._state.clear()
            if not keep_images:
                shutil.rmtree(self.node_cache, ignore_errors=True)
            self._prune_caches()
            return stopped

    def _prune_caches(self) -> None:
        """Other clusters' node caches whose checkout is gone or that went unused (node_cache.py)."""
        for cache in node_cache.prune(self._state):
            self.log(f"removed the node cache {cache}: its cluster is gone or unused for days")

    def status(self) -> dict[str, Any]:
        """{'components': {name: {'pid', 'running', 'rss_kib'}}, 'apiserver_ready', 'nodes_ready', ...}."""
        components = {}
        for name in self._components():
            pid = self._state.read_pid(name)
            up = self._is_ours(pid)
            components[name] = {"pid": pid, "running": up, "rss_kib": rss_kib(pid) if pid and up else 0}
        result: dict[str, Any] = {"components": components, "apiserver_ready": False, "nodes_ready": 0}
        if components["kube-apiserver"]["running"]:
            with contextlib.suppress(OSError, ClusterError):
                api = self._api()
                result["apiserver_ready"] = api.request("GET", "/readyz")[0] == 200
                code, body = api.request("GET", "/api/v1/nodes")
                if code == 200:
                    result["nodes_ready"] = sum(node_ready(n) for n in body["items"])
                    result["nodes_total"] = len(body["items"])
        result["kubeconfig"] = str(self.kubeconfig)
        return result

    def _addons(self) -> list[str]:
        return self._state.addons(before_addons=addons_mod.ALL)

    def _components(self) -> tuple[str, ...]:
        """The processes this cluster runs: the core's and its add-ons'."""
        return (*CORE, *addons_mod.components(self._addons()))

    def _is_ours(self, pid: int | None) -> bool:
        return pid is not None and owned_by(pid, COMPONENTS, self.state_dir) is not None

    def _healthy(self) -> bool:
        if not netns.exists(self._state.netns):
            return False
        if not all(self._is_ours(self._state.read_pid(c)) for c in self._components()):
            return False
        try:
            return self._api().request("GET", "/readyz")[0] == 200
        except (OSError, ClusterError):
            return False

    def _stop_all(self) -> list[str]:
        """Stop every process of this state dir, with or without a pid file, and remove what the
        real node leaves outside it: mounts, cgroups, the /run dir, the network namespace."""
        # Our own children too: one may be caught between fork and exec, its arguments not yet
        # the component's.
        found = find_owned(COMPONENTS, self.state_dir) | self._children.pids()
        # Aggregated APIs first: one whose server is gone breaks discovery and GC for everyone.
        if "prometheus-adapter" in found.values():
            with contextlib.suppress(OSError, ClusterError):
                monitoring.unregister(self._api().request)
        layout = node_layout(self._state)
        # The node agents first, so nothing restarts a pod; then the pods' processes (their
        # grace periods do not matter on the way down), containerd and the shims it left.
        self._children.terminate([p for p, n in found.items() if n in ("kubelet", "kube-proxy", "coredns")])
        node_mod.kill_cgroup_tree(layout.cgroup)
        self._children.terminate([p for p, n in found.items() if n == "containerd"])
        self._children.terminate(list(find_owned({node_mod.SHIM}, layout.run)))
        # overlay rootfs, shm, nsfs (pod netns) and kubelet volume mounts live in the host's mount
        # namespace, below the state dir and the /run dir.
        mounted = node_mod.unmount_under([layout.root, layout.run, layout.containerd_root])
        cgroups = node_mod.remove_cgroups(layout.cgroup)
        # Clients of etcd first, etcd last, so nothing logs a burst of connection errors.
        rest = {p: n for p, n in found.items() if n not in node_mod.NODE_COMPONENTS}
        self._children.terminate([p for p, n in rest.items() if n != "etcd"])
        self._children.terminate([p for p, n in rest.items() if n == "etcd"])
        self._children.forget()
        netns.delete(self._state.netns)
        if not mounted:
            shutil.rmtree(layout.run, ignore_errors=True)
        if mounted or cgroups:
            raise ClusterError(
                f"could not remove {len(mounted)} mounts ({', '.join(mounted[:3])}) and "
                f"{len(cgroups)} cgroups ({', '.join(map(str, cgroups[:3]))}); state left in {self.state_dir}"
            )
        return [c for c in COMPONENTS if c in found.values()]

    def _rss(self) -> dict[str, int]:
        pids = {name: self._state.read_pid(name) for name in self._components()}
        return {name: rss_kib(pid) if pid else 0 for name, pid in pids.items()}

    def _api(self) -> Api:
        port = self._state.ports().get("kube-apiserver")
        if not port:
            raise ClusterError(f"no apiserver port recorded in {self.state_dir / 'cluster.json'}")
        return Api(port, pki.paths(self._state.pki_dir))

    def _nodes(self) -> list[dict[str, Any]]:
        return node_pools.build_nodes(node_pools.load_pools(self.node_pools_file))
