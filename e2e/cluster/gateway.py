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

from collections.abc import Callable
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


def traefik_config() -> dict[str, Any]:
    """Traefik's static configuration (its Kubernetes client comes from $KUBECONFIG)."""
    return {
        "global": {"checkNewVersion": False, "sendAnonymousUsage": False},
        "log": {"level": "INFO"},
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


def prepare(state: StateDir, pki: pki_mod.Pki, request: monitoring.Request, traefik: Path) -> list[str]:
    """Create the CRDs (they are Established by the time Traefik starts), the namespace, Service
    and RBAC; write Traefik's kubeconfig and static configuration; returns its arguments."""
    root = state.root / "gateway"
    root.mkdir(parents=True, exist_ok=True)
    crds = [yaml.safe_load(path.read_text()) for path in crd_files(traefik)]
    if not crds:
        raise RuntimeError(f"no Gateway API CRDs beside {traefik} (build-tools.sh copies them)")
    monitoring.create(request, crds + cluster_objects())
    kubeconfig.write(
        state.component_kubeconfig("gateway"), node_mod.APISERVER_PORT, pki, "gateway", host=netns.NODE_IP
    )
    config = root / "traefik.yml"
    config.write_text(yaml.safe_dump(traefik_config(), sort_keys=False))
    return [f"--configFile={config}"]


def env(state: StateDir) -> dict[str, str]:
    """Traefik's environment: its provider builds a cluster-external client from $KUBECONFIG."""
    return {"KUBECONFIG": str(state.component_kubeconfig("gateway"))}


def established(request: monitoring.Request, traefik: Path) -> bool:
    """Every Gateway API CRD is served."""
    for path in crd_files(traefik):
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        code, body = request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}", None)
        if code != 200 or not _true(body, "Established"):
            return False
    return True


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
