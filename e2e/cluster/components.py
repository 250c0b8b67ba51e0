"""The components: their binaries (build-tools.sh, containerd from Debian), start order and
readiness waits (their command lines are in flags.py; the waits' probes in readiness.py), and
the simulated nodes.

Everything but the forwarder runs inside the cluster's network namespace (netns.py), where ports
are fixed; the forwarder relays the host's 127.0.0.1:<free port> to the API server there."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from e2e.cluster import (
    artifacts,
    enforcer,
    flags,
    gateway,
    istio,
    kubeconfig,
    monitoring,
    netns,
    registry,
    routing,
)
from e2e.cluster import containerd_images as images_mod
from e2e.cluster import node as node_mod
from e2e.cluster import pki as pki_mod
from e2e.cluster.processes import Children, free_ports
from e2e.cluster.readiness import Api, ClusterError, create_nodes, http_ok, nodes_ready, wait
from e2e.cluster.state import StateDir

# In start order.
CONTROL_PLANE = ("etcd", "kube-apiserver", "forwarder", "kube-controller-manager", "kube-scheduler", "kwok")
COMPONENTS = (
    *CONTROL_PLANE, *registry.COMPONENTS, *node_mod.NODE_COMPONENTS, *enforcer.COMPONENTS,
    *monitoring.COMPONENTS, *gateway.COMPONENTS, *artifacts.COMPONENTS,
)  # fmt: skip
# What build-tools.sh must provide; kubectl and helm are only linked into <state>/bin for people and tests.
BINARIES = (
    "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok",
    "kubelet", "kube-proxy", "coredns", "kubectl", "helm", *enforcer.BINARIES, *monitoring.BINARIES,
    *gateway.BINARIES, *routing.BINARIES, *registry.BINARIES, *artifacts.BINARIES, *istio.BINARIES,
)  # fmt: skip
# From Debian (scripts/ensure-system-packages.sh): containerd, runc, CNI plugins, nft, iptables, ipset.
SYSTEM_BINARIES = ("containerd", "runc", "ctr", "nft", "nsenter", "ip", "iptables", "ipset")
BUILD_TOOLS = Path(__file__).with_name("build-tools.sh")
FORWARDER = Path(__file__).with_name("forwarder.py")
CONTROLLER_MANAGER_PORT, SCHEDULER_PORT = 10257, 10259
STARTUP_TIMEOUT_S = 90.0

Log = Callable[[str], None]


def run_build_tools(log: Log, script: Path = BUILD_TOOLS) -> tuple[dict[str, Path], dict[str, int]]:
    """Run build-tools.sh (reuses cached binaries) -> ({binary name: path}, {tool: build seconds})."""
    proc = subprocess.Popen(["bash", str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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
    for name in BINARIES:
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
    node_images: Sequence[str] = images_mod.NODE_IMAGES,
) -> dict[str, int]:
    """Create the namespace and start every component into an empty `state` (each once what it
    needs is ready), create `nodes` and wait until they and the real node are Ready; returns the
    host ports. `extra_args` go last (they win). `node_images` (images.builder names, and
    routing.IMAGES' keys) are in the real node's containerd before its kubelet starts."""
    ports = dict(zip(("kube-apiserver", "prometheus", "gateway"), free_ports(3), strict=True))
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

    def spawn(component: str, args: list[str], env: dict[str, str] | None = None) -> None:
        argv = [str(tools[component]), *args, *extra_args.get(component, [])]
        pid = children.spawn(component, netns.command(ns, argv), state.log_file(component), state.root, env)
        state.write_pid(component, pid)

    def wait_ready(what: str, ready: Callable[[], bool], component: str) -> None:
        wait(what, ready, STARTUP_TIMEOUT_S, children, state.log_file(component))

    def inside(url: str) -> Callable[[], bool]:
        return functools.partial(http_ok, url, ns)

    spawn("etcd", flags.etcd_args(state))
    wait_ready("etcd /health", inside(f"http://127.0.0.1:{flags.ETCD_PORT}/health"), "etcd")

    def forward(name: str, port: int, to: str) -> None:
        argv = [sys.executable, str(FORWARDER), f"--netns={ns}", f"--listen={port}", f"--to={to}",
                f"--state-dir={state.root}/"]  # fmt: skip
        state.write_pid(name, children.spawn(name, argv, state.log_file(name), state.root))

    spawn("kube-apiserver", flags.apiserver_args(pki))
    forward("forwarder", ports["kube-apiserver"], f"{netns.NODE_IP}:{node_mod.APISERVER_PORT}")
    api = Api(ports["kube-apiserver"], pki)
    wait_ready("kube-apiserver /readyz", lambda: api.request("GET", "/readyz")[0] == 200, "kube-apiserver")

    spawn(
        "kube-controller-manager",
        [
            *flags.client_args(state, "kube-controller-manager", CONTROLLER_MANAGER_PORT),
            *flags.controller_manager_args(pki),
        ],
    )
    spawn("kube-scheduler", flags.client_args(state, "kube-scheduler", SCHEDULER_PORT))
    # kwok always loads ~/.kwok/kwok.yaml if present; keep a developer's config out.
    spawn(
        "kwok",
        flags.kwok_args(state, tools["kwok"].parent / "stages"),
        env={**os.environ, "HOME": str(state.root)},
    )
    create_nodes(api, nodes)
    try:  # the model stores need nothing of the cluster: they start now and are seeded at the end
        stores = artifacts.start(state, tools, children)
    except (ImportError, RuntimeError, OSError, subprocess.CalledProcessError) as e:
        raise ClusterError(f"preparing the model stores failed: {e}") from None
    try:
        monitoring_args = monitoring.prepare(state, pki, api.request)
    except (RuntimeError, OSError) as e:
        raise ClusterError(f"preparing the monitoring stack failed: {e}") from None
    spawn("prometheus", monitoring_args["prometheus"])
    forward("prometheus-forwarder", ports["prometheus"], f"{netns.NODE_IP}:{monitoring.PROMETHEUS_PORT}")
    spawn("prometheus-adapter", monitoring_args["prometheus-adapter"])
    try:  # the Gateway API and the Inference Extension's CRDs are installed while the rest starts
        install = gateway.Install(api.request, tools["traefik"])
        gie = routing.crd_files(tools["epp"])
        gie_install = gateway.Install(api.request, tools["epp"], gie, [], "the Inference Extension")
        traefik_args = gateway.prepare(state, pki)
    except (RuntimeError, OSError) as e:
        raise ClusterError(f"preparing the Gateway API and the Inference Extension failed: {e}") from None

    # The test registry, then the real node's images in it: images.builder's, and the router's
    # upstream-named ones (routing.py).
    try:
        registry_args = registry.prepare(
            state.root / "registry", state.node_cache / "registry", state.pki_dir
        )
    except (OSError, subprocess.CalledProcessError) as e:
        raise ClusterError(
            f"preparing the registry failed ({e}): htpasswd comes from apache2-utils, "
            "run scripts/ensure-system-packages.sh"
        ) from None
    spawn("registry", registry_args)
    wait_ready("the registry", lambda: registry.ready(ns), "registry")
    layout = node_layout(state)
    built = [name for name in node_images if name not in routing.IMAGES]
    archives, sandbox_image = images_mod.node_archives(layout.root, log, built)
    try:
        archives += routing.archives(tools, [name for name in node_images if name in routing.IMAGES], log)
    except (ImportError, RuntimeError, OSError, subprocess.CalledProcessError) as e:
        raise ClusterError(f"writing the router's images failed: {e}") from None
    try:
        registry.push_images(state, tools["crane"], archives, log)
    except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as e:
        raise ClusterError(f"pushing images to the test registry failed: {e}") from None
    kubeconfigs = {c: state.component_kubeconfig(c) for c in IN_NAMESPACE_CLIENTS}
    node_mod.write_configs(layout, pki, sandbox_image, kubeconfigs, kubeconfig.CLUSTER_NAME)
    registry.write_hosts(layout.certs_d, pki.ca.cert, registry.passwords(state.root / "registry").node)
    node_mod.create_cgroups(layout.cgroup)
    for obj in (*node_mod.COREDNS_RBAC, *enforcer.RBAC):
        kind = "clusterroles" if obj["kind"] == "ClusterRole" else "clusterrolebindings"
        code, body = api.request("POST", f"/apis/rbac.authorization.k8s.io/v1/{kind}", obj)
        if code not in (201, 409):
            raise ClusterError(
                f"creating {obj['kind']} {obj['metadata']['name']} failed: HTTP {code}: {body}"
            )
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
    spawn("containerd", args["containerd"])
    wait_ready("containerd", containerd_up, "containerd")
    spawn("kubelet", args["kubelet"])
    spawn("kube-proxy", args["kube-proxy"])
    spawn("coredns", args["coredns"])

    wait_ready(
        "kube-controller-manager /healthz",
        inside(f"https://127.0.0.1:{CONTROLLER_MANAGER_PORT}/healthz"),
        "kube-controller-manager",
    )
    wait_ready(
        "kube-scheduler /healthz", inside(f"https://127.0.0.1:{SCHEDULER_PORT}/healthz"), "kube-scheduler"
    )
    wait_ready(
        "the default ServiceAccount",
        lambda: api.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
        "kube-controller-manager",
    )
    wait_ready("node-pool nodes Ready", lambda: nodes_ready(api, nodes), "kwok")
    wait_ready(
        f"the real node {pki_mod.NODE_NAME} Ready",
        lambda: nodes_ready(api, [], [pki_mod.NODE_NAME]),
        "kubelet",
    )
    # kube-router identifies its node by the Node object, which the kubelet has registered by now.
    spawn("kube-router", enforcer.prepare(state, pki))
    wait_ready("kube-proxy /healthz", inside("http://127.0.0.1:10256/healthz"), "kube-proxy")
    wait_ready("CoreDNS /ready", inside(f"http://127.0.0.1:{node_mod.COREDNS_READY_PORT}/ready"), "coredns")
    wait_ready(
        "kube-router /healthz", inside(f"http://127.0.0.1:{enforcer.HEALTH_PORT}/healthz"), "kube-router"
    )
    try:  # Prometheus and the adapter started early; the custom metrics API once the adapter answers
        monitoring.finish(api.request, pki, inside, wait_ready)
    except RuntimeError as e:
        raise ClusterError(f"registering the custom metrics API failed: {e}") from None
    try:  # Traefik's informers need the CRDs served before it starts
        wait_ready("the Gateway API CRDs served", install.done, "kube-apiserver")
        spawn("traefik", traefik_args, env={**os.environ, **gateway.env(state)})
        forward("gateway-forwarder", ports["gateway"], f"{netns.NODE_IP}:{gateway.PORT}")
        gateway.finish(api.request, inside, wait_ready)
    except RuntimeError as e:
        raise ClusterError(f"starting the Gateway failed: {e}") from None
    try:
        wait_ready("the Inference Extension CRDs served", gie_install.done, "kube-apiserver")
    except RuntimeError as e:
        raise ClusterError(str(e)) from None
    wait_ready(
        "the model stores", functools.partial(artifacts.ready, lambda u: http_ok(u, ns), stores), "versitygw"
    )
    try:
        artifacts.seed_in(ns, stores, state.node_cache)
    except RuntimeError as e:
        raise ClusterError(str(e)) from None
    return ports


def node_layout(state: StateDir) -> node_mod.NodeLayout:
    return node_mod.NodeLayout(state.node_dir, state.run_dir, state.cgroup, state.node_cache / "containerd")
