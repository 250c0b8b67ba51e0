"""The NetworkPolicy of a deployment: who may connect to its serving pods.

One policy selects every serving pod (all pools, both slots of a rollout, leaders and workers),
so a canary's pods are covered from their first start. It admits the client ports (Triton's HTTP
and gRPC, the OpenAI API; only the OpenAI API when spec.routing.apiKeys closes Triton's, which check
no key) from the deployment's own namespace, the namespaces and CIDRs the spec names, its metrics
port from the monitoring peers the operator is configured with, and every port between the pods of
the deployment's multi-node groups: the launch agent (2222) for the leader's mpirun, and the ports
MPI and NCCL pick at run time. Nothing else. Those pods share one launch identity per deployment,
so narrowing the last rule to one group would guard nothing the identity does not. Traffic from
the pod's own node (kubelet probes) is always allowed by NetworkPolicy's definition.

routing.mode inference-pool adds the router: its pods may reach the leaders' OpenAI API (8080)
and metrics (8002, which the picker scrapes), and a second policy admits the clients to the
router's OpenAI port, and to the picker's ext_proc port only the namespaces of gateways that route
to the InferencePool (spec.routing.picker.gatewayNamespaceSelector); the router's Envoy asks it on
127.0.0.1, which no policy governs.

Upgrades: operators before clients were limited admitted any source by default. A policy applied
that way (a client rule without `from`) stays so while the spec names no clients, marked with the
KEPT_ANY_SOURCE annotation, so upgrading the operator cuts off no client; naming clients
(clientNamespaceSelector or clientCIDRs) ends it for good.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from typing import Any

from llm_operator import labels as L
from llm_operator.api.v1alpha1 import DNS_LABEL, LabelSelector, LLMDeployment, NetworkPolicySpec, TritonPorts
from llm_operator.contract import GRPC_PORT, HTTP_PORT, METRICS_PORT, OPENAI_PORT
from llm_operator.render import names
from llm_operator.render.router.envoy import PICKER_GRPC_PORT, PICKER_METRICS_PORT
from llm_operator.render.router.objects import router_pod_labels
from llm_operator.render.scale_to_zero import PUSH_PORT

NAMESPACE_NAME = "kubernetes.io/metadata.name"  # set by the API server on every namespace
KEPT_ANY_SOURCE = "llmoperator.io/clients-from-any-source"
# Where Prometheus runs unless the operator is told otherwise (LLMOP_METRICS_PEERS).
DEFAULT_METRICS_PEERS = ("monitoring",)
# Where KEDA runs unless the operator is told otherwise (LLMOP_KEDA_NAMESPACE), and the label of its
# operator's pods (upstream's manifests, config/manager/manager.yaml, and its Helm chart both set it):
# the one client of the waker's external-push scaler.
DEFAULT_KEDA_NAMESPACE = "keda"
KEDA_OPERATOR_LABELS = {"app": "keda-operator"}


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


def opened_to_any_source(policy: dict[str, Any] | None) -> bool:
    """Whether an applied serving policy admits clients from any source (a client rule without
    `from`): what operators before clients were limited applied by default."""
    for rule in ((policy or {}).get("spec") or {}).get("ingress") or []:
        if "from" not in rule and {"protocol": "TCP", "port": OPENAI_PORT} in (rule.get("ports") or []):
            return True
    return False


def _selected(selector: LabelSelector) -> dict[str, Any]:
    return {"namespaceSelector": selector.model_dump(mode="json", by_alias=True, exclude_none=True)}


def _clients(spec: NetworkPolicySpec, any_source: bool, *ports: int) -> dict[str, Any]:
    """The client rule: the own namespace, the namespaces and CIDRs the spec names; no `from`
    (any source) for a policy kept from before clients were limited."""
    if any_source:
        return {"ports": _tcp(*ports)}
    peers: list[dict[str, Any]] = [{"podSelector": {}}]  # every pod of the policy's namespace
    if spec.client_namespace_selector is not None:
        peers.append(_selected(spec.client_namespace_selector))
    peers += [{"ipBlock": {"cidr": cidr}} for cidr in spec.client_cidrs]
    return {"from": peers, "ports": _tcp(*ports)}


def _metadata(name: str, namespace: str, labels: dict[str, str], any_source: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    if any_source:
        meta["annotations"] = {
            KEPT_ANY_SOURCE: "kept from an earlier operator: name the clients in "
            "spec.networkPolicy.clientNamespaceSelector or clientCIDRs to end it"
        }
    return meta


def network_policy(
    deployment: str,
    namespace: str,
    spec: NetworkPolicySpec,
    metrics_peers: Sequence[str],
    *,
    router: bool = False,
    triton_closed: bool = False,
    keep_any_source: bool = False,
) -> dict[str, Any]:
    """`keep_any_source`: the applied policy admits any source (opened_to_any_source); kept while
    the spec names no clients."""
    any_source = keep_any_source and not spec.limits_clients
    # With API keys (unless the spec opens them), Triton's own APIs, which check no key, are not
    # client ports: only the key-checking OpenAI port is.
    client_ports = (OPENAI_PORT,) if triton_closed else (HTTP_PORT, GRPC_PORT, OPENAI_PORT)
    clients = _clients(spec, any_source, *client_ports)
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
        "metadata": _metadata(
            names.network_policy(deployment), namespace, L.common_labels(deployment, "serving"), any_source
        ),
        "spec": {
            "podSelector": {"matchLabels": L.selector_labels(deployment)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def router_network_policy(
    deployment: str,
    namespace: str,
    spec: NetworkPolicySpec,
    metrics_peers: Sequence[str],
    gateways: LabelSelector | None = None,
    *,
    keep_any_source: bool = False,
    keda_namespace: str | None = None,
) -> dict[str, Any]:
    """The router pods (routing.mode inference-pool): clients on the OpenAI port, the gateways'
    namespaces on the picker's ext_proc port, the monitoring peers on the picker's metrics port,
    and with a waker (`keda_namespace` given, minReplicas 0) KEDA's operator pods in that namespace
    on the waker's external-push port; nothing else. A policy kept from before clients were limited
    admitted clients to the first two ports."""
    any_source = keep_any_source and not spec.limits_clients and gateways is None
    if any_source:
        ingress = [_clients(spec, True, OPENAI_PORT, PICKER_GRPC_PORT)]
    else:
        ingress = [_clients(spec, False, OPENAI_PORT)]
        if gateways is not None:
            ingress.append({"from": [_selected(gateways)], "ports": _tcp(PICKER_GRPC_PORT)})
    if metrics_peers:
        ingress.append({"from": [peer(p) for p in metrics_peers], "ports": _tcp(PICKER_METRICS_PORT)})
    if keda_namespace is not None:
        keda = {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME: keda_namespace}},
                "podSelector": {"matchLabels": dict(KEDA_OPERATOR_LABELS)}}  # fmt: skip
        ingress.append({"from": [keda], "ports": _tcp(PUSH_PORT)})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(
            names.router(deployment), namespace, L.common_labels(deployment, "router"), any_source
        ),
        "spec": {
            "podSelector": {"matchLabels": router_pod_labels(deployment)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }
