"""Services: the client-facing one (leaders only) and the headless one (pod DNS for groups)."""

from __future__ import annotations

from typing import Any

from llm_operator import labels as L
from llm_operator.contract import GRPC_PORT, HTTP_PORT, METRICS_PORT, OPENAI_PORT
from llm_operator.render import names

PORTS = [
    {"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
    {"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc", "protocol": "TCP"},
    {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
    {"name": "openai", "port": OPENAI_PORT, "targetPort": "openai", "protocol": "TCP"},
]


def client_service(deployment: str, namespace: str) -> dict[str, Any]:
    """Only leaders (rank 0) serve, so only they are behind the user-facing Service."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": names.client_service(deployment),
            "namespace": namespace,
            "labels": L.common_labels(deployment, "serving"),
        },
        "spec": {
            "type": "ClusterIP",
            "selector": {**L.selector_labels(deployment), L.ROLE: "leader"},
            "ports": PORTS,
        },
    }


def headless_service(deployment: str, namespace: str) -> dict[str, Any]:
    """Stable DNS names for every serving pod; multi-node ranks find each other through it."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": names.headless_service(deployment),
            "namespace": namespace,
            "labels": L.common_labels(deployment, "serving"),
        },
        "spec": {
            "clusterIP": "None",
            # Workers must resolve the leader before it is Ready (the world forms before serving).
            "publishNotReadyAddresses": True,
            "selector": L.selector_labels(deployment),
            "ports": PORTS,
        },
    }


def endpoints(deployment: str, namespace: str, openai: str | None = None) -> dict[str, str]:
    """status.endpoints: in-cluster addresses of the client Service, which every routing and rollout
    mode keeps (a gateway-api canary's HTTPRoute splits /v2 and /v1 alike; docs/serving-api.md).
    `openai`: the router's URL in routing.mode inference-pool (render/router/objects.py), which only the
    OpenAI API goes through."""
    host = f"{names.client_service(deployment)}.{namespace}.svc"
    return {
        "http": f"http://{host}:{HTTP_PORT}",
        "grpc": f"{host}:{GRPC_PORT}",
        "metrics": f"http://{host}:{METRICS_PORT}/metrics",
        "openai": openai or f"http://{host}:{OPENAI_PORT}/v1",
    }
