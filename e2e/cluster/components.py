"""The control-plane components: their binaries (build-tools.sh), command lines, start order and
readiness waits, the simulated nodes, and the minimal apiserver client the waits use."""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import os
import re
import ssl
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from e2e.cluster import kubeconfig
from e2e.cluster import pki as pki_mod
from e2e.cluster.processes import Children, free_ports, last_line
from e2e.cluster.state import StateDir, shown

# In start order.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
# What build-tools.sh must provide; kubectl and helm are only linked into <state>/bin for people and tests.
BINARIES = (*COMPONENTS, "kubectl", "helm")
BUILD_TOOLS = Path(__file__).with_name("build-tools.sh")
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
STARTUP_TIMEOUT_S = 90.0

Log = Callable[[str], None]


class ClusterError(Exception):
    """A failure to report as one line (which component, what happened, where its log is)."""


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
    return tools, builds


class Api:
    """Minimal HTTPS client for the apiserver, authenticated as the admin client."""

    def __init__(self, port: int, pki: pki_mod.Pki) -> None:
        self.port = port
        self.ctx = ssl.create_default_context(cafile=str(pki.ca.cert))
        admin = pki.clients["admin"]
        self.ctx.load_cert_chain(str(admin.cert), str(admin.key))

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=10)
        try:
            payload = json.dumps(body) if body is not None else None
            conn.request(method, path, payload, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        try:
            return resp.status, json.loads(data)
        except ValueError:
            return resp.status, data.decode(errors="replace")


def _http_ok(url: str) -> bool:
    """GET url (TLS unverified: the component serves a throwaway self-signed cert) and expect 200."""
    scheme, rest = url.split("://", 1)
    hostport, _, path = rest.partition("/")
    host, port = hostport.rsplit(":", 1)
    conn: http.client.HTTPConnection
    if scheme == "https":
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        conn = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=2)
    else:
        conn = http.client.HTTPConnection(host, int(port), timeout=2)
    try:
        conn.request("GET", "/" + path)
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def node_ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def create_nodes(api: Api, nodes: Sequence[dict[str, Any]]) -> None:
    for node in nodes:
        code, body = api.request("POST", "/api/v1/nodes", node)
        if code not in (201, 409):  # 409: exists already (idempotent `up`)
            raise ClusterError(f"creating node {node['metadata']['name']} failed: HTTP {code}: {body}")


def nodes_ready(api: Api, nodes: Sequence[dict[str, Any]]) -> bool:
    wanted = {n["metadata"]["name"] for n in nodes}
    code, body = api.request("GET", "/api/v1/nodes")
    if code != 200:
        return False
    ready = {n["metadata"]["name"] for n in body["items"] if node_ready(n)}
    return wanted <= ready


def wait(
    what: str, ready: Callable[[], bool], timeout: float, children: Children, log: Path | None = None
) -> None:
    """Poll `ready` until true; fail with one line when it times out (naming `log`) or as soon as
    one of `children` exits (with the last line of its log: usually why)."""
    deadline = time.monotonic() + timeout
    while True:
        if exited := children.exited():
            reason = last_line(exited.log)
            raise ClusterError(
                f"{exited.name} exited with code {exited.code} during startup"
                + (f": {reason}" if reason else "")
                + f" (log: {shown(exited.log)})"
            )
        with contextlib.suppress(OSError):
            if ready():
                return
        if time.monotonic() > deadline:
            where = f" (log: {shown(log)})" if log else ""
            raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}{where}")
        time.sleep(0.1)


# -- command lines ----------------------------------------------------------------------------------
def _etcd_args(state: StateDir, client_url: str, peer_url: str) -> list[str]:
    return [
        "--name=llmop",
        f"--data-dir={state.etcd_dir}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=llmop={peer_url}",
        "--unsafe-no-fsync",  # throwaway data: fsync only costs time
    ]


def _apiserver_args(port: int, etcd_url: str, pki: pki_mod.Pki) -> list[str]:
    return [
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        # Loopback cannot be an Endpoints address, so the `kubernetes` Service gets none.
        "--advertise-address=127.0.0.1",
        "--endpoint-reconciler-type=none",
        f"--tls-cert-file={pki.apiserver.cert}",
        f"--tls-private-key-file={pki.apiserver.key}",
        f"--client-ca-file={pki.ca.cert}",
        "--authorization-mode=RBAC",
        f"--service-account-issuer={SA_ISSUER}",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        f"--service-cluster-ip-range={pki_mod.SERVICE_CLUSTER_IP_RANGE}",
        "--allow-privileged=true",
        # Front proxy: lets aggregated APIs (custom/external metrics) trust the aggregator.
        f"--requestheader-client-ca-file={pki.front_proxy_ca.cert}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki.front_proxy_client.cert}",
        f"--proxy-client-key-file={pki.front_proxy_client.key}",
    ]


def _client_args(state: StateDir, component: str, port: int) -> list[str]:
    """Flags the controller manager and the scheduler share."""
    kc = state.component_kubeconfig(component)
    return [
        f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        # Single instance: a leader lease would only delay restarts.
        "--leader-elect=false",
    ]


def _controller_manager_args(pki: pki_mod.Pki) -> list[str]:
    return [
        f"--root-ca-file={pki.ca.cert}",
        f"--service-account-private-key-file={pki.sa_key}",
        "--use-service-account-credentials=false",
        f"--cluster-signing-cert-file={pki.ca.cert}",
        f"--cluster-signing-key-file={pki.ca.key}",
        # Test-speed HPA loops (defaults: 15 s sync, 5 min downscale stabilization).
        "--horizontal-pod-autoscaler-sync-period=2s",
        "--horizontal-pod-autoscaler-downscale-stabilization=10s",
    ]


def _kwok_args(state: StateDir) -> list[str]:
    return [
        f"--kubeconfig={state.component_kubeconfig('kwok')}",
        "--manage-all-nodes=true",
        # Without a lease duration kwok v0.7.0 renews no node leases and heartbeats node
        # status only every ~10 min: the node lifecycle controller then marks every node
        # NotReady after ~50 s (NodeNotReady events) and kwok flips it back. Measured here.
        "--node-lease-duration-seconds=40",
        "--cidr=10.244.0.0/16",
    ]


# -- start order ------------------------------------------------------------------------------------
def start(
    state: StateDir,
    tools: Mapping[str, Path],
    children: Children,
    nodes: Sequence[dict[str, Any]],
    extra_args: Mapping[str, Sequence[str]],
) -> dict[str, int]:
    """Start every component into an empty `state` (each once what it needs is ready), create
    `nodes` and wait until they are Ready; returns the ports. `extra_args` go last (they win)."""
    names = ("etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    state.create(ports, tools)
    pki = pki_mod.generate(state.pki_dir)
    kubeconfig.write(state.kubeconfig, ports["kube-apiserver"], pki, "admin")
    for client in ("kube-controller-manager", "kube-scheduler", "kwok"):
        kubeconfig.write(state.component_kubeconfig(client), ports["kube-apiserver"], pki, client)
    for name in ("kubectl", "helm"):
        (state.bin_dir / name).symlink_to(tools[name])
    kubeconfig.write_env(state.env_file, state.kubeconfig, state.bin_dir)

    def spawn(component: str, args: list[str], env: dict[str, str] | None = None) -> None:
        argv = [str(tools[component]), *args, *extra_args.get(component, [])]
        pid = children.spawn(component, argv, state.log_file(component), state.root, env)
        state.write_pid(component, pid)

    def wait_ready(what: str, ready: Callable[[], bool], component: str) -> None:
        wait(what, ready, STARTUP_TIMEOUT_S, children, state.log_file(component))

    etcd_url = f"http://127.0.0.1:{ports['etcd']}"
    spawn("etcd", _etcd_args(state, etcd_url, f"http://127.0.0.1:{ports['etcd-peer']}"))
    wait_ready("etcd /health", lambda: _http_ok(f"{etcd_url}/health"), "etcd")

    spawn("kube-apiserver", _apiserver_args(ports["kube-apiserver"], etcd_url, pki))
    api = Api(ports["kube-apiserver"], pki)
    wait_ready("kube-apiserver /readyz", lambda: api.request("GET", "/readyz")[0] == 200, "kube-apiserver")

    spawn(
        "kube-controller-manager",
        [
            *_client_args(state, "kube-controller-manager", ports["kube-controller-manager"]),
            *_controller_manager_args(pki),
        ],
    )
    spawn("kube-scheduler", _client_args(state, "kube-scheduler", ports["kube-scheduler"]))
    # kwok always loads ~/.kwok/kwok.yaml if present; keep a developer's config out.
    spawn("kwok", _kwok_args(state), env={**os.environ, "HOME": str(state.root)})
    create_nodes(api, nodes)
    for component in ("kube-controller-manager", "kube-scheduler"):
        healthz = functools.partial(_http_ok, f"https://127.0.0.1:{ports[component]}/healthz")
        wait_ready(f"{component} /healthz", healthz, component)
    wait_ready(
        "the default ServiceAccount",
        lambda: api.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
        "kube-controller-manager",
    )
    wait_ready("node-pool nodes Ready", lambda: nodes_ready(api, nodes), "kwok")
    return ports
