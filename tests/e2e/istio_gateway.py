"""Istio (e2e/cluster/istio.py) installed into the session's cluster for one test module, and the
Gateway, HTTPRoute and DestinationRule a user of Istio writes to route to an LLMDeployment's
InferencePool (docs/routing.md, "Gateways that route to an InferencePool")."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from llm_operator.render.router.envoy import PICKER_GRPC_PORT

from e2e.cluster import Cluster, istio
from e2e.cluster.components import run_build_tools
from e2e.cluster.state import StateDir
from e2e.cluster.testing import Kubectl, wait_for
from e2e.generate import connection

REPO = Path(__file__).resolve().parents[2]
GATEWAY = "inference-gateway"  # the name examples/httproute-inference-pool.yaml's route names
SERVICE = f"{GATEWAY}-istio"  # the Service istiod deploys for it (kube-gateway template)
PORT = 80
GROUP = "gateway.networking.k8s.io"
MONITORING_PORT = 15014  # istiod's own metrics
_REJECTS = re.compile(r"^pilot_total_xds_rejects(?:\{[^}]*\})?\s+(\S+)", re.MULTILINE)


def tools(cluster: Cluster) -> dict[str, Path]:
    """The binaries this needs, as the running cluster's `up` found them; Istio's are built here,
    the first time a test needs them (a warm run only checks the cache)."""
    found = {k: Path(v) for k, v in StateDir(cluster.state_dir).meta()["tools"].items()}
    if not all(name in found for name in (*istio.BINARIES, "envoy", "helm")):
        found = run_build_tools(lambda line: None, groups=("core", "routing", "istio"))[0]
    return found


def install(cluster: Cluster, kubectl: Kubectl, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Import the images into the real node, create the CRDs and istiod, and wait until istiod is
    Ready; returns what was created, for uninstall()."""
    found = tools(cluster)
    for name in istio.IMAGES:
        cluster.import_image(istio.archive(name, found, log))
    objects = [
        *istio.crds(found["pilot-discovery"]),
        *istio.istiod_objects(found["helm"], found["pilot-discovery"]),
    ]
    kubectl.apply(objects)
    wait_for(
        "istiod Ready",
        lambda: kubectl.get("deployment", "istiod", istio.NAMESPACE),
        lambda d: d is not None and (d.get("status") or {}).get("readyReplicas", 0) >= 1,
        timeout=120,
    )
    return objects


def uninstall(kubectl: Kubectl, objects: list[dict[str, Any]]) -> None:
    """istiod first (it would recreate what follows), then its GatewayClasses, the root
    certificate ConfigMaps it wrote into every namespace, and the cluster-scoped objects."""
    kubectl.delete_namespace(istio.NAMESPACE)
    for cls in kubectl.items("gatewayclasses"):  # the ones istiod created: `istio`, `istio-remote`
        if cls["spec"]["controllerName"].startswith("istio.io/"):
            kubectl.delete("gatewayclass", cls["metadata"]["name"])
    kubectl("delete", "configmap", "-A", "-l", "istio.io/config=true", "--ignore-not-found", "--wait=false")
    for obj in objects:
        if "namespace" not in obj["metadata"] and obj["kind"] != "Namespace":
            kubectl("delete", obj["kind"], obj["metadata"]["name"], "--ignore-not-found", "--wait=false")


def gateway(namespace: str) -> dict[str, Any]:
    """An HTTP listener for routes of every namespace, behind a ClusterIP Service (the test world
    has no load balancer to give the default LoadBalancer one an address)."""
    listener = {
        "name": "http",
        "port": PORT,
        "protocol": "HTTP",
        "allowedRoutes": {"namespaces": {"from": "All"}},
    }
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Gateway",
        "metadata": {
            "name": GATEWAY,
            "namespace": namespace,
            "annotations": {"networking.istio.io/service-type": "ClusterIP"},
        },
        "spec": {"gatewayClassName": istio.GATEWAY_CLASS, "listeners": [listener]},
    }


def route(pool: str, gateway_namespace: str) -> dict[str, Any]:
    """examples/httproute-inference-pool.yaml, to `pool`, on the Gateway of `gateway_namespace`."""
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "httproute-inference-pool.yaml").read_text())
    doc["metadata"]["name"] = pool
    doc["spec"]["parentRefs"][0]["namespace"] = gateway_namespace
    doc["spec"]["rules"][0]["backendRefs"][0]["name"] = pool
    return doc


def picker_tls(router_service: str, namespace: str) -> dict[str, Any]:
    """The picker serves ext_proc over TLS with a self-signed certificate: Istio must be told (as
    the Inference Extension's inferencepool chart does for provider istio, templates/istio.yaml)."""
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": f"{router_service}-picker"},
        "spec": {
            "host": f"{router_service}.{namespace}.svc.cluster.local",
            "trafficPolicy": {
                "portLevelSettings": [
                    {
                        "port": {"number": PICKER_GRPC_PORT},
                        "tls": {"mode": "SIMPLE", "insecureSkipVerify": True},
                    }
                ]
            },
        },
    }


def xds_rejects(kubectl: Kubectl, netns: str) -> float:
    """istiod's count of configurations a proxy rejected (NACKed); absent until one is."""
    [pod] = kubectl.items("pods", istio.NAMESPACE, "app=istiod")
    conn = connection(pod["status"]["podIP"], MONITORING_PORT, inside=netns, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    assert "pilot_xds_pushes" in text, text[:300]  # istiod's metrics, not some other page
    return sum(float(v) for v in _REJECTS.findall(text))
