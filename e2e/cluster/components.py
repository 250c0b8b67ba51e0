"""The components: their binaries (build-tools.sh, containerd from Debian), start order and
readiness waits (their command lines are in flags.py; the waits' probes in readiness.py), and
the simulated nodes. The core (control plane, registry, real node) always starts; the add-ons
(addons.py) when asked for.

Everything but the forwarders runs inside the cluster's network namespace (netns.py), where ports
are fixed; the forwarders relay the host's 127.0.0.1:<free port> to the API server (and to the
add-ons' Prometheus and gateway) there."""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from e2e.cluster import addons as addons_mod
from e2e.cluster import containerd_images as images_mod
from e2e.cluster import flags, istio, keda, kubeconfig, lws, monitoring, netns, registry
from e2e.cluster import node as node_mod
from e2e.cluster import pki as pki_mod
from e2e.cluster.processes import Children, free_ports, owned_by
from e2e.cluster.readiness import Api, ClusterError, create_nodes, create_rbac, nodes_ready, wait
from e2e.cluster.starter import STARTUP_TIMEOUT_S, Log, Starter, node_layout
from e2e.cluster.state import StateDir

__all__ = ["STARTUP_TIMEOUT_S", "Log", "node_layout"]

# In start order.
CONTROL_PLANE = ("etcd", "kube-apiserver", "forwarder", "kube-controller-manager", "kube-scheduler", "kwok")
CORE = (*CONTROL_PLANE, *registry.COMPONENTS, *node_mod.NODE_COMPONENTS)
# Every process a cluster of ours may run (what `down` looks for).
COMPONENTS = (*CORE, *addons_mod.components(addons_mod.ALL))
# What build-tools.sh's core group must provide; kubectl and helm are only linked into <state>/bin
# for people and tests.
CORE_BINARIES = (
    "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok",
    "kubelet", "kube-proxy", "coredns", "kubectl", "helm", *registry.BINARIES,
)  # fmt: skip
# From Debian (scripts/ensure-system-packages.sh): containerd, runc, CNI plugins, nft, iptables, ipset.
SYSTEM_BINARIES = ("containerd", "runc", "ctr", "nft", "nsenter", "ip", "iptables", "ipset")
BUILD_TOOLS = Path(__file__).with_name("build-tools.sh")
CONTROLLER_MANAGER_PORT, SCHEDULER_PORT = 10257, 10259


def binaries(groups: Sequence[str]) -> tuple[str, ...]:
    """What build-tools.sh must provide for `groups` (core, the add-ons' names, istio, keda, lws)."""
    extra = {"core": CORE_BINARIES, "istio": istio.BINARIES, "keda": keda.BINARIES, "lws": (lws.BINARY,)}
    return tuple(b for g in groups for b in (extra[g] if g in extra else addons_mod.ADDONS[g].binaries))


def run_build_tools(
    log: Log, script: Path = BUILD_TOOLS, groups: Sequence[str] = ("core",)
) -> tuple[dict[str, Path], dict[str, int]]:
    """Run build-tools.sh for `groups` (reuses cached binaries) -> ({binary name: path}, {tool:
    build seconds})."""
    argv = ["bash", str(script), *groups]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    assert proc.stdout is not None
    builds: dict[str, int] = {}
    reason = "see its output above"
    for line in proc.stderr:  # progress goes to the user as it happens; the error becomes ours
        line = line.rstrip()
        if line.startswith("build-tools: error: "):
            reason = line.removeprefix("build-tools: error: ")
            continue
        log(line)
        if m := re.match(r"build-tools: (\S+) built in (\d+) s", line):
            builds[m[1]] = int(m[2])
    dirs = [Path(d) for d in proc.stdout.read().split()]
    if proc.wait() != 0:
        raise ClusterError(f"{script.name} failed (exit {proc.returncode}): {reason}")
    tools = {}
    for name in binaries(groups):
        found = [d / name for d in dirs if (d / name).is_file()]
        if not found:
            raise ClusterError(f"{script.name} produced no {name} binary in {', '.join(map(str, dirs))}")
        tools[name] = found[0]
    for name in SYSTEM_BINARIES:
        where = shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
        if not where:
            raise ClusterError(f"{name} is not installed: run scripts/ensure-system-packages.sh (as root)")
        tools[name] = Path(where)
    if not Path("/usr/lib/cni/bridge").is_file():
        raise ClusterError("CNI plugins missing (/usr/lib/cni/bridge): run scripts/ensure-system-packages.sh")
    return tools, builds


# -- start order ------------------------------------------------------------------------------------
IN_NAMESPACE_CLIENTS = (
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "kubelet",
    "kube-proxy",
    "coredns",
)


def start(
    state: StateDir,
    tools: Mapping[str, Path],
    children: Children,
    nodes: Sequence[dict[str, Any]],
    extra_args: Mapping[str, Sequence[str]],
    log: Log,
    images: Callable[[], tuple[list[Path], str]],
    wanted: Sequence[addons_mod.Addon] = (),
) -> dict[str, int]:
    """Create the namespace and start the core and the `wanted` add-ons into an empty `state`
    (each once what it needs is ready), create `nodes` and wait until they and the real node are
    Ready; returns the host ports. `extra_args` go last (they win). `images()` returns the node's
    image archives (images.builder's, built meanwhile) and the sandbox image's name: they are in
    the real node's containerd before its kubelet starts."""
    ports = {"kube-apiserver": free_ports(1)[0]}
    state.create(ports, tools)
    ns = state.netns
    netns.create(ns)
    pki = pki_mod.generate(state.pki_dir)
    kubeconfig.write(state.kubeconfig, ports["kube-apiserver"], pki, "admin")
    for client in IN_NAMESPACE_CLIENTS:
        kc = state.component_kubeconfig(client)
        kubeconfig.write(kc, node_mod.APISERVER_PORT, pki, client, host=netns.NODE_IP)
    for name in ("kubectl", "helm"):
        (state.bin_dir / name).symlink_to(tools[name])
    kubeconfig.write_env(state.env_file, state.kubeconfig, state.bin_dir)
    s = Starter(state, tools, children, pki, Api(ports["kube-apiserver"], pki), log, extra_args, ports)

    s.spawn("etcd", flags.etcd_args(state))
    s.wait_ready("etcd /health", s.inside(f"http://127.0.0.1:{flags.ETCD_PORT}/health"), "etcd")
    s.spawn("kube-apiserver", flags.apiserver_args(pki))
    s.forward("forwarder", ports["kube-apiserver"], f"{netns.NODE_IP}:{node_mod.APISERVER_PORT}")
    api = s.api
    s.wait_ready("kube-apiserver /readyz", lambda: api.request("GET", "/readyz")[0] == 200, "kube-apiserver")

    s.spawn(
        "kube-controller-manager",
        [
            *flags.client_args(state, "kube-controller-manager", CONTROLLER_MANAGER_PORT),
            *flags.controller_manager_args(pki),
        ],
    )
    s.spawn("kube-scheduler", flags.client_args(state, "kube-scheduler", SCHEDULER_PORT))
    # kwok always loads ~/.kwok/kwok.yaml if present; keep a developer's config out.
    s.spawn(
        "kwok",
        flags.kwok_args(state, tools["kwok"].parent / "stages"),
        env={**os.environ, "HOME": str(state.root)},
    )
    create_nodes(api, nodes)
    # The add-ons' first half (what needs only the API server) overlaps the node's start.
    finishes = [addon.begin(s) for addon in wanted]

    # The test registry, then the real node's images in it.
    try:
        registry_args = registry.prepare(
            state.root / "registry", state.node_cache / "registry", state.pki_dir
        )
    except (OSError, subprocess.CalledProcessError) as e:
        raise ClusterError(
            f"preparing the registry failed ({e}): htpasswd comes from apache2-utils, "
            "run scripts/ensure-system-packages.sh"
        ) from None
    s.spawn("registry", registry_args)
    s.wait_ready("the registry", lambda: registry.ready(ns), "registry")
    layout = node_layout(state)
    archives, sandbox_image = images()
    try:
        registry.push_images(state, tools["crane"], archives, log)
    except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as e:
        raise ClusterError(f"pushing images to the test registry failed: {e}") from None
    kubeconfigs = {c: state.component_kubeconfig(c) for c in IN_NAMESPACE_CLIENTS}
    node_mod.write_configs(layout, pki, sandbox_image, kubeconfigs, kubeconfig.CLUSTER_NAME)
    registry.write_hosts(layout.certs_d, pki.ca.cert, registry.passwords(state.root / "registry").node)
    node_mod.create_cgroups(layout.cgroup)
    create_rbac(api, node_mod.COREDNS_RBAC)
    args = node_mod.command_lines(layout, kubeconfigs)

    def containerd_up() -> bool:
        return layout.socket.exists() and images_mod.ctr(layout, "version", timeout=5).returncode == 0

    # containerd without CRI first: the kept root loses the last instance's pods (CRI would
    # recover them) and pulls the images it lacks; then containerd as the kubelet's runtime.
    argv = [str(tools["containerd"]), *args["containerd-images"]]
    images_log = state.log_file("containerd-images")
    pid = children.spawn("containerd", netns.command(ns, argv), images_log, state.root)
    wait("containerd (images)", containerd_up, STARTUP_TIMEOUT_S, children, images_log)
    try:
        images_mod.remove_old_pods(layout)
        shutil.rmtree(layout.containerd_root / node_mod.CRI_PLUGIN, ignore_errors=True)
        moving = registry.default_names(archives)
        images_mod.sync_images(layout, ns, archives, images_mod.LOCAL_REGISTRY, log, moving)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        raise ClusterError(f"pulling images into the real node's containerd failed: {e}") from None
    children.terminate([pid])
    s.spawn("containerd", args["containerd"])
    s.wait_ready("containerd", containerd_up, "containerd")
    s.spawn("kubelet", args["kubelet"])
    s.spawn("kube-proxy", args["kube-proxy"])
    s.spawn("coredns", args["coredns"])

    s.wait_ready(
        "kube-controller-manager /healthz",
        s.inside(f"https://127.0.0.1:{CONTROLLER_MANAGER_PORT}/healthz"),
        "kube-controller-manager",
    )
    s.wait_ready(
        "kube-scheduler /healthz", s.inside(f"https://127.0.0.1:{SCHEDULER_PORT}/healthz"), "kube-scheduler"
    )
    s.wait_ready(
        "the default ServiceAccount",
        lambda: api.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
        "kube-controller-manager",
    )
    s.wait_ready("node-pool nodes Ready", lambda: nodes_ready(api, nodes), "kwok")
    s.wait_ready(
        f"the real node {pki_mod.NODE_NAME} Ready",
        lambda: nodes_ready(api, [], [pki_mod.NODE_NAME]),
        "kubelet",
    )
    s.wait_ready("kube-proxy /healthz", s.inside("http://127.0.0.1:10256/healthz"), "kube-proxy")
    s.wait_ready(
        "CoreDNS /ready", s.inside(f"http://127.0.0.1:{node_mod.COREDNS_READY_PORT}/ready"), "coredns"
    )
    for finish in finishes:
        finish()
    state.record(ports=ports, tools=tools, addons=[a.name for a in wanted])
    return ports


def extend(
    state: StateDir,
    tools: Mapping[str, Path],
    children: Children,
    log: Log,
    wanted: Sequence[addons_mod.Addon],
    extra_args: Mapping[str, Sequence[str]],
) -> dict[str, int]:
    """Start the `wanted` add-ons in the running cluster of `state` with their `tools` beside the
    ones it runs (`extra_args` as for start()); returns the host ports. An add-on that fails is
    stopped again (the rest keeps running)."""
    pki = pki_mod.paths(state.pki_dir)
    ports = state.ports()
    tools = {**{k: Path(v) for k, v in state.meta().get("tools", {}).items()}, **tools}
    s = Starter(state, tools, children, pki, Api(ports["kube-apiserver"], pki), log, extra_args, ports)
    for addon in wanted:
        try:
            addon.begin(s)()
        except BaseException:
            pids = [state.read_pid(c) for c in addon.components]
            started = [p for p in pids if p is not None and owned_by(p, COMPONENTS, state.root)]
            if addon.name == "monitoring":  # a gone aggregated API breaks discovery for everyone
                with contextlib.suppress(OSError, http.client.HTTPException):
                    monitoring.unregister(s.api.request)
            children.terminate(started)
            raise
        state.record(ports=ports, tools=tools, addons=[*state.addons(), addon.name])
    return ports
