"""The NetworkPolicy of a deployment: who may connect to its serving pods.

One policy selects every serving pod (all pools, both slots of a rollout, leaders and workers),
so a canary's pods are covered from their first start. It admits the client ports (Triton's HTTP
and gRPC, the OpenAI API; only the OpenAI API when spec.routing.apiKeys closes Triton's, which check
no key) from any source (or the namespaces the spec selects), its metrics port
from the monitoring peers the operator is configured with, and every port between the pods of the
deployment's multi-node groups: sshd (2222) for the leader's mpirun, and the ports MPI and NCCL
pick at run time. Nothing else. Those pods share one SSH key per deployment, so narrowing the last
rule to one group would guard nothing the key does not. Traffic from the pod's own node (kubelet
probes) is always allowed by NetworkPolicy's definition.

routing.mode inference-pool adds the router: its pods may reach the leaders' OpenAI API (8080)
and metrics (8002, which the picker scrapes), and a second policy admits the clients to the
router's OpenAI port and the picker's ext_proc port (a gateway routing to the InferencePool).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from typing import Any

from llm_operator import labels as L
from llm_operator.api.v1alpha1 import DNS_LABEL, LLMDeployment, NetworkPolicySpec, TritonPorts
from llm_operator.contract import GRPC_PORT, HTTP_PORT, METRICS_PORT, OPENAI_PORT
from llm_operator.render import names
from llm_operator.render.router_config import PICKER_GRPC_PORT, PICKER_METRICS_PORT
from llm_operator.render.routing import router_pod_labels

NAMESPACE_NAME = "kubernetes.io/metadata.name"  # set by the API server on every namespace
# Where Prometheus runs unless the operator is told otherwise (LLMOP_METRICS_PEERS).
DEFAULT_METRICS_PEERS = ("monitoring",)


def parse_peers(text: str, what: str = "LLMOP_METRICS_PEERS") -> tuple[str, ...]:
    """A comma-separated list of namespace names and CIDRs (192.0.2.7/32). Raises ValueError
    naming the bad entry (the operator's own configuration, not a user's input)."""
    peers = tuple(p.strip() for p in text.split(",") if p.strip())
    for entry in peers:
        if "/" in entry:
            try:
                ipaddress.ip_network(entry)
            except ValueError as e:
                raise ValueError(f"{what}: {entry} is not a CIDR such as 192.0.2.0/24 ({e})") from None
        elif len(entry) > 63 or not re.fullmatch(DNS_LABEL, entry):
            raise ValueError(f"{what}: {entry} is neither a namespace name nor a CIDR such as 192.0.2.0/24")
    return peers


def peer(entry: str) -> dict[str, Any]:
    """A NetworkPolicyPeer: a CIDR is an ipBlock (a Prometheus that runs outside pods), a name
    every pod of that namespace."""
    if "/" in entry:
        return {"ipBlock": {"cidr": str(ipaddress.ip_network(entry))}}
    return {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME: entry}}}


def triton_closed(ld: LLMDeployment) -> bool:
    """spec.routing.apiKeys keeps clients off Triton's own ports, which check no key."""
    keys = ld.spec.routing.api_keys
    return keys is not None and keys.triton_ports == TritonPorts.CLOSED


def _tcp(*ports: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": p} for p in ports]


def _clients(spec: NetworkPolicySpec, *ports: int) -> dict[str, Any]:
    clients: dict[str, Any] = {"ports": _tcp(*ports)}  # no `from`: any source
    if spec.client_namespace_selector is not None:
        selector = spec.client_namespace_selector.model_dump(mode="json", by_alias=True, exclude_none=True)
        clients = {"from": [{"namespaceSelector": selector}], **clients}
    return clients


def network_policy(
    deployment: str,
    namespace: str,
    spec: NetworkPolicySpec,
    metrics_peers: Sequence[str],
    *,
    router: bool = False,
    triton_closed: bool = False,
) -> dict[str, Any]:
    # With API keys (unless the spec opens them), Triton's own APIs, which check no key, are not
    # client ports: only the key-checking OpenAI port is.
    client_ports = (OPENAI_PORT,) if triton_closed else (HTTP_PORT, GRPC_PORT, OPENAI_PORT)
    clients = _clients(spec, *client_ports)
    group_members = {
        "matchLabels": L.selector_labels(deployment),
        "matchExpressions": [{"key": L.GROUP_SIZE, "operator": "Exists"}],  # multi-node pods only
    }
    ingress = [clients, {"from": [{"podSelector": group_members}]}]
    if metrics_peers:  # none: nobody scrapes (a rule without `from` would admit everyone)
        ingress.insert(1, {"from": [peer(p) for p in metrics_peers], "ports": _tcp(METRICS_PORT)})
    if router:  # the router's pods, wherever clients may come from
        ingress.append({"from": [{"podSelector": {"matchLabels": router_pod_labels(deployment)}}],
                        "ports": _tcp(OPENAI_PORT, METRICS_PORT)})  # fmt: skip
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": names.network_policy(deployment),
            "namespace": namespace,
            "labels": L.common_labels(deployment, "serving"),
        },
        "spec": {
            "podSelector": {"matchLabels": L.selector_labels(deployment)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def router_network_policy(
    deployment: str, namespace: str, spec: NetworkPolicySpec, metrics_peers: Sequence[str]
) -> dict[str, Any]:
    """The router pods (routing.mode inference-pool): clients on the OpenAI port and the picker's
    ext_proc port, the monitoring peers on the picker's metrics port; nothing else."""
    ingress = [_clients(spec, OPENAI_PORT, PICKER_GRPC_PORT)]
    if metrics_peers:
        ingress.append({"from": [peer(p) for p in metrics_peers], "ports": _tcp(PICKER_METRICS_PORT)})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": names.router(deployment),
            "namespace": namespace,
            "labels": L.common_labels(deployment, "router"),
        },
        "spec": {
            "podSelector": {"matchLabels": router_pod_labels(deployment)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }
