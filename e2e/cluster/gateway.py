"""The test world's Gateway API implementation: Traefik (kubernetesGateway provider), so HTTPRoute
weights route real requests (docs/development.md, "The Gateway").

Traefik runs as a process inside the cluster's network namespace, like Prometheus, with its own
client certificate and least-privilege RBAC. The Gateway API CRDs (standard channel) come from the
`sigs.k8s.io/gateway-api` module version Traefik is built against (build-tools.sh copies them next
to the binary). `up` creates GatewayClass `traefik` and Gateway `gateway-system/llmop` with one
HTTP listener `http` on the node address; a Service `llmop.gateway-system.svc:80` points at it for
pods, and a 127.0.0.1 forwarder for the host (`Cluster.gateway_url`).

Traefik balances over a Service's ready EndpointSlice addresses and dials them only when a request
comes: HTTPRoutes may name Services of KWOK pods (fake addresses), but only requests routed to the
real node's pods may ever be sent.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from e2e.cluster import kubeconfig, monitoring, netns
from e2e.cluster import node as node_mod
from e2e.cluster import pki as pki_mod
from e2e.cluster.state import StateDir

# Processes, in start order (the forwarder is forwarder.py, matched by its stem).
COMPONENTS = ("traefik", "gateway-forwarder")
BINARIES = ("traefik",)
NAMESPACE = "gateway-system"
GATEWAY_CLASS = "traefik"
GATEWAY = "llmop"
LISTENER = "http"
CONTROLLER_NAME = "traefik.io/gateway-controller"
# The listener's port is the Traefik entry point's (Traefik matches listeners to entry points by
# port), on the node address; the in-cluster Service listens on 80.
PORT = 8000
SERVICE_PORT = 80
PING_PORT = 8082  # Traefik's own entry point (/ping), on 127.0.0.1 inside the namespace
URL = f"http://{GATEWAY}.{NAMESPACE}.svc"  # as pods reach the Gateway
GROUP = "gateway.networking.k8s.io"
# What the kubernetesGateway provider watches (its informers) and whose status it writes.
WATCHED = ("gatewayclasses", "gateways", "httproutes", "grpcroutes", "referencegrants", "backendtlspolicies")
STATUS_WRITTEN = ("gatewayclasses", "gateways", "httproutes", "grpcroutes", "backendtlspolicies")


def crd_files(traefik: Path) -> list[Path]:
    """The standard-channel CRDs build-tools.sh copied from the gateway-api module beside `traefik`."""
    return sorted((traefik.parent / "crds").glob("*.yaml"))


class Install:
    """Creates CRDs (the Gateway API's, by default), then `objects` (by default the Gateway's
    namespace, Service and RBAC), in a background thread: the API server spends seconds compiling
    the CRDs' validation rules, which then overlaps the rest of the cluster's start instead of
    adding to it. `binary`: the program build-tools.sh copied the CRDs beside."""

    def __init__(
        self,
        request: monitoring.Request,
        binary: Path,
        files: Sequence[Path] | None = None,
        objects: Sequence[dict[str, Any]] | None = None,
        what: str = "the Gateway API",
    ) -> None:
        self._request = request
        self._files = list(files if files is not None else crd_files(binary))
        self._objects = list(objects if objects is not None else cluster_objects())
        self._what = what
        if not self._files:
            raise RuntimeError(f"no CRDs of {what} beside {binary} (build-tools.sh copies them)")
        self._crds: list[dict[str, Any]] = []
        self._error: Exception | None = None
        self._thread = threading.Thread(target=self._create, daemon=True)
        self._thread.start()

    def _create(self) -> None:
        # libyaml's loader: the pure-Python one takes about 2 s for these 700 kB.
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        try:
            self._crds = [yaml.load(path.read_text(), Loader=loader) for path in self._files]
            monitoring.create(self._request, [*self._crds, *self._objects])
        # An API server that goes away mid-answer raises HTTPException: done() reports it too.
        except (RuntimeError, OSError, http.client.HTTPException, yaml.YAMLError) as e:
            self._error = e

    def done(self) -> bool:
        """All created, and every served version of each CRD is in API discovery (what Traefik's
        informers list); raises RuntimeError if creating something failed."""
        if self._thread.is_alive():
            return False
        if self._error is not None:
            raise RuntimeError(f"installing {self._what} and its objects failed: {self._error}")
        served: dict[str, set[str]] = {}
        for crd in self._crds:
            group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
            for version in (v["name"] for v in crd["spec"]["versions"] if v["served"]):
                served.setdefault(f"/apis/{group}/{version}", set()).add(plural)
        for path, plurals in served.items():
            code, body = self._request("GET", path, None)
            if code != 200 or not plurals <= {r["name"] for r in body.get("resources", [])}:
                return False
        return True


def traefik_config() -> dict[str, Any]:
    """Traefik's static configuration (its Kubernetes client comes from $KUBECONFIG)."""
    return {
        "global": {"checkNewVersion": False, "sendAnonymousUsage": False},
        "log": {"level": "INFO", "noColor": True},
        "entryPoints": {
            # A short grace period: `down` need not wait Traefik's default 10 s.
            "web": {"address": f"{netns.NODE_IP}:{PORT}", "transport": {"lifeCycle": {"graceTimeOut": "1s"}}},
            "traefik": {"address": f"127.0.0.1:{PING_PORT}"},
        },
        "ping": {},
        "providers": {"kubernetesGateway": {"statusAddress": {"ip": netns.NODE_IP}}},
    }


def gateway_objects() -> list[dict[str, Any]]:
    """The GatewayClass and the Gateway: one HTTP listener taking routes from every namespace."""
    api = f"{GROUP}/v1"
    listener = {
        "name": LISTENER,
        "protocol": "HTTP",
        "port": PORT,
        "allowedRoutes": {"namespaces": {"from": "All"}},
    }
    return [
        {
            "apiVersion": api,
            "kind": "GatewayClass",
            "metadata": {"name": GATEWAY_CLASS},
            "spec": {"controllerName": CONTROLLER_NAME},
        },
        {
            "apiVersion": api,
            "kind": "Gateway",
            "metadata": {"name": GATEWAY, "namespace": NAMESPACE},
            "spec": {"gatewayClassName": GATEWAY_CLASS, "listeners": [listener]},
        },
    ]


def cluster_objects() -> list[dict[str, Any]]:
    """The namespace, the in-cluster Service and Traefik's RBAC (what its provider's informers
    read, cluster-wide since routes live in any namespace, and the status it writes)."""
    user = pki_mod.CLIENTS["gateway"][0]
    read = ["get", "list", "watch"]
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": user},
        "rules": [
            # Secrets: TLS listeners' certificates (its informer starts whether or not any exist).
            {
                "apiGroups": [""],
                "resources": ["namespaces", "services", "configmaps", "secrets"],
                "verbs": read,
            },
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": read},
            {"apiGroups": [GROUP], "resources": list(WATCHED), "verbs": read},
            {"apiGroups": [GROUP], "resources": [f"{r}/status" for r in STATUS_WRITTEN], "verbs": ["update"]},
        ],
    }
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        *monitoring.in_cluster_service(GATEWAY, SERVICE_PORT, PORT, NAMESPACE),
        role,
        monitoring.binding("ClusterRoleBinding", user, "ClusterRole", user, user),
    ]


def prepare(state: StateDir, pki: pki_mod.Pki) -> list[str]:
    """Write Traefik's kubeconfig and static configuration; returns its arguments."""
    root = state.root / "gateway"
    root.mkdir(parents=True, exist_ok=True)
    kubeconfig.write(
        state.component_kubeconfig("gateway"), node_mod.APISERVER_PORT, pki, "gateway", host=netns.NODE_IP
    )
    config = root / "traefik.yml"
    config.write_text(yaml.safe_dump(traefik_config(), sort_keys=False))
    return [f"--configFile={config}"]


def env(state: StateDir) -> dict[str, str]:
    """Traefik's environment: its provider builds a cluster-external client from $KUBECONFIG."""
    return {"KUBECONFIG": str(state.component_kubeconfig("gateway"))}


def finish(
    request: monitoring.Request,
    inside: Callable[[str], Callable[[], bool]],
    wait_ready: Callable[[str, Callable[[], bool], str], None],
) -> None:
    """Create the GatewayClass and the Gateway, then wait until Traefik answers (`inside(url)`: a
    probe from inside the namespace) and has programmed the Gateway."""
    monitoring.create(request, gateway_objects())
    wait_ready("Traefik /ping", inside(f"http://127.0.0.1:{PING_PORT}/ping"), "traefik")
    wait_ready(f"Gateway {NAMESPACE}/{GATEWAY} Programmed", lambda: programmed(request), "traefik")


def programmed(request: monitoring.Request) -> bool:
    """The Gateway is Programmed: Traefik accepted the class and serves the listener."""
    code, body = request("GET", f"/apis/{GROUP}/v1/namespaces/{NAMESPACE}/gateways/{GATEWAY}", None)
    return code == 200 and _true(body, "Programmed")


def _true(obj: dict[str, Any], type_: str) -> bool:
    conditions = obj.get("status", {}).get("conditions", [])
    return any(c["type"] == type_ and c["status"] == "True" for c in conditions)
