"""routing.mode inference-pool: the InferencePool of a deployment's leaders and its router.

The router is the standalone pattern kubernetes-sigs/gateway-api-inference-extension v1.5.0
documents (config/charts/standalone): one Deployment `<name>-router` running the endpoint picker
(EPP) and Envoy side by side; Envoy asks the EPP over ext_proc which leader to send each OpenAI
request to (render/router/envoy.py). A cluster whose gateway implements InferencePool (Istio,
agentgateway, NGINX Gateway Fabric) can route to the pool with an HTTPRoute instead; the EPP is the
same (the pool's endpointPickerRef names the router Service's port 9002). docs/routing.md.

Pure: the same spec renders the same objects (golden files pin them).
"""

from __future__ import annotations

import copy
from typing import Any

from llm_operator import labels as L
from llm_operator.api.v1alpha1 import LLMDeployment, RoutingMode
from llm_operator.contract import METRICS_PORT, OPENAI_PORT
from llm_operator.images import Images
from llm_operator.render import names
from llm_operator.render.pod import SECRET_FILE_MODE, template_hash
from llm_operator.render.router.envoy import (
    ENVOY_READY_PORT,
    PICKER_CA_MOUNT,
    PICKER_GRPC_PORT,
    PICKER_HEALTH_PORT,
    PICKER_METRICS_PORT,
    envoy_config,
    envoy_yaml,
    epp_config,
)
from llm_operator.render.router.limits import RouterLimits, router_limits
from llm_operator.render.router.waker import ENVOY_BEHIND_WAKER_PORT, waker_container, waker_rule, waking
from llm_operator.render.scale_to_zero import (
    PUSH_PORT,
    PUSH_PORT_NAME,
    flow_control,
    hold_annotations,
    router_hold,
)

POOL_GROUP = "inference.networking.k8s.io"
POOL_API_VERSION = f"{POOL_GROUP}/v1"
# InferenceObjective and InferenceModelRewrite, which the v1.5.0 EPP watches when their CRDs exist
# (pkg/epp/server/controller_config.go, controller_manager.go).
OBJECTIVE_GROUP = "inference.networking.x-k8s.io"
COMPONENT = "router"
CONFIG_MOUNT = "/config"
ENVOY_CONFIG_MOUNT = "/etc/envoy"
# Restricted Pod Security, and nothing to write: both programs read their files and serve.
RESTRICTED: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
}
# The distroless images' nonroot user: numeric, so the kubelet can check runAsNonRoot.
NONROOT_UID = 65532
# What the EPP reads in its own namespace: the GIE v1.5.0 charts grant exactly this
# (config/charts/epplib/templates/_rbac.yaml: pods; config/charts/standalone/templates/rbac.yaml:
# inferencepools, inferenceobjectives, inferencemodelrewrites). The operator holds each of these
# itself, or the API server refuses it the Role (controller/cluster/rbac.py).
ROUTER_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [POOL_GROUP], "resources": ["inferencepools"], "verbs": ["get", "list", "watch"]},
    {
        "apiGroups": [OBJECTIVE_GROUP],
        "resources": ["inferenceobjectives", "inferencemodelrewrites"],
        "verbs": ["get", "list", "watch"],
    },
]


def router_pod_labels(deployment: str) -> dict[str, str]:
    """Not the serving pods' labels: the client Service, the NetworkPolicy of the serving pods and
    the operator's pod watch (managed-by) must not take the router for a replica."""
    return {L.NAME: "llm-operator", L.INSTANCE: deployment, L.COMPONENT: COMPONENT}


def leader_selector(deployment: str) -> dict[str, str]:
    """Leaders of every live revision (both slots): a canary's share of ready leaders is its share
    of the pool, and a canary at weight 0 has no leader the picker could choose."""
    return {**L.selector_labels(deployment), L.ROLE: "leader"}


def inference_pool(ld: LLMDeployment) -> dict[str, Any]:
    return {
        "apiVersion": POOL_API_VERSION,
        "kind": "InferencePool",
        "metadata": {
            "name": names.inference_pool(ld.name),
            "namespace": ld.namespace,
            "labels": L.common_labels(ld.name, "routing"),
        },
        "spec": {
            "selector": {"matchLabels": leader_selector(ld.name)},
            # The OpenAI API: the EPP parses OpenAI bodies (a multi-pod replica is its leader).
            "targetPorts": [{"number": OPENAI_PORT}],
            "endpointPickerRef": {
                "name": names.router(ld.name),
                "port": {"number": PICKER_GRPC_PORT},
                "failureMode": ld.spec.routing.failure_mode.value,
            },
        },
    }


def limits_for(ld: LLMDeployment, running_hold: int | None = None) -> RouterLimits:
    """What the router's Envoy and waker are both rendered with: the limits at the hold of
    router_hold (`running_hold`: the derived hold the applied ConfigMap records)."""
    return router_limits(ld.spec, router_hold(ld, running_hold) or 0)


def router_config(ld: LLMDeployment, limits: RouterLimits) -> dict[str, Any]:
    """At minReplicas 0 the picker holds requests while no replica is ready, for the hold of
    `limits` (limits_for)."""
    service = f"{names.client_service(ld.name)}.{ld.namespace}.svc"
    zero = ld.spec.autoscaling.zero if ld.spec.autoscaling is not None else None
    # With a waker, clients reach it and it Envoy, on 127.0.0.1 only (render/router/waker.py).
    behind = waking(ld)
    config = envoy_config(ld.spec.routing.failure_mode, service, limits=limits,
                          client_bind="127.0.0.1" if behind else None,
                          listen_port=ENVOY_BEHIND_WAKER_PORT if behind else OPENAI_PORT)  # fmt: skip
    meta, picker = _meta(ld), None
    if zero is not None:
        picker = flow_control(zero, limits.hold_s)
        if annotations := hold_annotations(zero, limits.hold_s):
            meta["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta,
        "data": {"epp.yaml": epp_config(picker), "envoy.yaml": envoy_yaml(config)},
    }


def _meta(ld: LLMDeployment) -> dict[str, Any]:
    return {
        "name": names.router(ld.name),
        "namespace": ld.namespace,
        "labels": L.common_labels(ld.name, COMPONENT),
    }


def _epp(ld: LLMDeployment, image: str) -> dict[str, Any]:
    """Flags of GIE v1.5.0 cmd/epp (pkg/epp/server/options.go), as its chart passes them
    (config/charts/epplib/templates/_deployment.yaml)."""
    health = {"grpc": {"port": PICKER_HEALTH_PORT, "service": "inference-extension"}}
    return {
        "name": "epp",
        "image": image,
        "args": [
            "--pool-name",
            names.inference_pool(ld.name),
            "--pool-namespace",
            ld.namespace,
            "--pool-group",
            POOL_GROUP,
            "--config-file",
            f"{CONFIG_MOUNT}/epp.yaml",
            "--grpc-port",
            str(PICKER_GRPC_PORT),
            "--grpc-health-port",
            str(PICKER_HEALTH_PORT),
            "--metrics-port",
            str(PICKER_METRICS_PORT),
            # No --refresh-metrics-interval: its 50 ms default (pkg/epp/server/options.go) is
            # already finer than the TensorRT-LLM backend refreshes its gauges
            # (stats_check_period_ms, 100 ms in every profile).
            # Triton's metrics are on 8002, not on the pool's target port (in v1.5.0 only this
            # flag sets it: pkg/epp/datastore/datastore.go).
            "--model-server-metrics-port",
            str(METRICS_PORT),
            # Authenticating scrapes takes cluster-wide TokenReview/SubjectAccessReview rights;
            # the NetworkPolicy admits the monitoring peers only instead.
            "--metrics-endpoint-auth=false",
            "--tracing=false",  # no OpenTelemetry collector is configured
            "--zap-encoder",
            "json",
            # The deployment's certificate (controller/secrets/picker_tls.py), which Envoy verifies, and
            # a replaced Secret is served without a restart.
            "--cert-path",
            PICKER_TLS_MOUNT,
            "--enable-cert-reload",
        ],
        "env": [
            {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        "ports": [
            {"name": "grpc", "containerPort": PICKER_GRPC_PORT, "protocol": "TCP"},
            {"name": "grpc-health", "containerPort": PICKER_HEALTH_PORT, "protocol": "TCP"},
            {"name": "picker-metrics", "containerPort": PICKER_METRICS_PORT, "protocol": "TCP"},
        ],
        "livenessProbe": {**copy.deepcopy(health), "initialDelaySeconds": 5, "periodSeconds": 10},
        "readinessProbe": {**copy.deepcopy(health), "periodSeconds": 2},
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        "securityContext": copy.deepcopy(RESTRICTED),
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": True},
            copy.deepcopy(TOKEN),
            {"name": PICKER_TLS_VOLUME, "mountPath": PICKER_TLS_MOUNT, "readOnly": True},
        ],
    }


# The picker's API credentials, as the API server would mount them into every container, mounted
# into the picker's and the waker's only (the waker reads its LLMDeployment's status while it holds
# requests): Envoy holds no token (automountServiceAccountToken is off for the pod).
TOKEN_VOLUME = "picker-token"
TOKEN_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN = {"name": TOKEN_VOLUME, "mountPath": TOKEN_MOUNT, "readOnly": True}
TOKEN_SOURCES = [
    {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
]


# The picker's certificate and key to the picker, the authority's certificate alone to Envoy; the
# pod's fsGroup makes them readable to the containers' user and to no other.
PICKER_TLS_VOLUME = "picker-tls"
PICKER_TLS_MOUNT = "/etc/llm-operator/picker-tls"
PICKER_CA_VOLUME = "picker-ca"


def _picker_tls_volumes(ld: LLMDeployment) -> list[dict[str, Any]]:
    secret = names.picker_tls_secret(ld.name, ld.metadata.get("uid", ""))

    def volume(name: str, *keys: str) -> dict[str, Any]:
        items = [{"key": k, "path": k} for k in keys]
        source = {"secretName": secret, "items": items, "defaultMode": SECRET_FILE_MODE}
        return {"name": name, "secret": source}

    return [volume(PICKER_TLS_VOLUME, "tls.crt", "tls.key"), volume(PICKER_CA_VOLUME, "ca.crt")]


def _envoy(image: str, behind_waker: bool) -> dict[str, Any]:
    ports = [{"name": "ready", "containerPort": ENVOY_READY_PORT, "protocol": "TCP"}]
    if not behind_waker:  # else the waker's port, and Envoy's OpenAI listener is on 127.0.0.1
        ports.insert(0, {"name": "openai", "containerPort": OPENAI_PORT, "protocol": "TCP"})
    return {
        "name": "envoy",
        "image": image,
        "command": ["envoy"],
        "args": [
            "-c",
            f"{ENVOY_CONFIG_MOUNT}/envoy.yaml",
            # Hot restart needs a shared-memory region and a second process: a pod restarts instead.
            "--disable-hot-restart",
            "--drain-strategy",
            "immediate",
            "--drain-time-s",
            "30",
            "--log-level",
            "warn",
        ],
        "ports": ports,
        "readinessProbe": {"httpGet": {"path": "/ready", "port": ENVOY_READY_PORT}, "periodSeconds": 5},
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        "securityContext": copy.deepcopy(RESTRICTED),
        "volumeMounts": [
            {"name": "config", "mountPath": ENVOY_CONFIG_MOUNT, "readOnly": True},
            {"name": PICKER_CA_VOLUME, "mountPath": PICKER_CA_MOUNT, "readOnly": True},
        ],
    }


def router_deployment(
    ld: LLMDeployment, images: Images, config: dict[str, Any], limits: RouterLimits
) -> dict[str, Any]:
    """`config`: router_config's ConfigMap, rendered with the same `limits` as the waker here."""
    labels = router_pod_labels(ld.name)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(ld),
        "spec": {
            "replicas": 1,
            # Upstream recreates its single EPP (its prefix-cache state); a new router is ready
            # before the old one goes instead, so a spec edit never stops the traffic.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "selector": {"matchLabels": labels},
            "template": {
                # The files are read at start: a changed ConfigMap restarts the router.
                "metadata": {
                    "labels": labels,
                    "annotations": {L.TEMPLATE_HASH: template_hash(config["data"])},
                },
                "spec": {
                    "serviceAccountName": names.router(ld.name),
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": 60,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": NONROOT_UID,
                        "runAsGroup": NONROOT_UID,
                        "fsGroup": NONROOT_UID,
                        "fsGroupChangePolicy": "OnRootMismatch",
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        _epp(ld, images.picker),
                        _envoy(images.envoy, waking(ld)),
                        *_waker(ld, images, limits),
                    ],
                    "volumes": [
                        {"name": "config", "configMap": {"name": names.router(ld.name)}},
                        {"name": TOKEN_VOLUME, "projected": {"sources": copy.deepcopy(TOKEN_SOURCES)}},
                        *_picker_tls_volumes(ld),
                    ],
                },
            },
        },
    }


def _waker(ld: LLMDeployment, images: Images, limits: RouterLimits) -> list[dict[str, Any]]:
    return [waker_container(ld, images.waker, limits, TOKEN)] if waking(ld) else []


def router_service(ld: LLMDeployment) -> dict[str, Any]:
    """The OpenAI API through the router (status.endpoints.openai), and the picker's ext_proc port
    for a gateway that routes to the InferencePool itself (its endpointPickerRef). The router pod
    stays behind its Service while the picker is not ready (its readiness makes the pod unready and
    status says PickerUnavailable), so Envoy answers as the failure mode says: the client Service
    (FailOpen) or a 503 (FailClose); left to kube-proxy, a Service with no ready endpoint refuses
    the connection, and the client gets no answer at all. At minReplicas 0, the waker's port for
    KEDA's external-push scaler too."""
    spec: dict[str, Any] = {
        "publishNotReadyAddresses": True,
        "type": "ClusterIP",
        "selector": router_pod_labels(ld.name),
        "ports": [
            {"name": "openai", "port": OPENAI_PORT, "targetPort": "openai", "protocol": "TCP"},
            # No appProtocol: the picker speaks gRPC over TLS (a self-signed certificate), which
            # kubernetes.io/h2c (cleartext) would misname to a gateway that reads it (GIE v1.5.0's
            # own chart sets none: config/charts/epplib/templates/_service.yaml).
            {"name": "grpc-picker", "port": PICKER_GRPC_PORT, "targetPort": "grpc", "protocol": "TCP"},
        ],
    }  # fmt: skip
    if waking(ld):  # KEDA's external-push scaler: gRPC in cleartext (docs/autoscaling.md says why)
        spec["ports"].append({"name": PUSH_PORT_NAME, "port": PUSH_PORT, "targetPort": PUSH_PORT_NAME,
                              "protocol": "TCP", "appProtocol": "kubernetes.io/h2c"})  # fmt: skip
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(ld), "spec": spec}


def router_rbac(ld: LLMDeployment) -> list[dict[str, Any]]:
    subject = {"kind": "ServiceAccount", "name": names.router(ld.name), "namespace": ld.namespace}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(ld)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(ld),
            "rules": copy.deepcopy(ROUTER_RULES) + ([waker_rule(ld)] if waking(ld) else []),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta(ld),
            "subjects": [subject],
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": names.router(ld.name),
            },
        },
    ]


def routing_children(
    ld: LLMDeployment, images: Images, running_hold: int | None = None
) -> list[dict[str, Any]]:
    """Nothing in routing.mode service: switching back prunes all of it. `running_hold`: limits_for's."""
    if ld.spec.routing.mode != RoutingMode.INFERENCE_POOL:
        return []
    limits = limits_for(ld, running_hold)
    config = router_config(ld, limits)
    return [
        *router_rbac(ld),
        config,
        router_deployment(ld, images, config, limits),
        router_service(ld),
        inference_pool(ld),
    ]


def openai_endpoint(ld: LLMDeployment) -> str | None:
    """status.endpoints.openai through the router; None in routing.mode service."""
    if ld.spec.routing.mode != RoutingMode.INFERENCE_POOL:
        return None
    return f"http://{names.router(ld.name)}.{ld.namespace}.svc:{OPENAI_PORT}/v1"
