"""The test world's monitoring stack: Prometheus and prometheus-adapter, the chain behind the HPAs
the operator renders (docs/autoscaling.md).

Both run as processes inside the cluster's network namespace, like the control plane, on the node
address. In-cluster they are Services in namespace `monitoring` whose EndpointSlices point at that
address (`http://prometheus.monitoring.svc:9090`, and the adapter behind the custom.metrics.k8s.io
APIServices); the host reaches Prometheus through a second 127.0.0.1 forwarder.

Prometheus discovers serving pods through the API server (kubernetes_sd_configs, as a PodMonitor
would), scrapes only pods on the real node (never KWOK's fake pod IPs) and evaluates the chart's
recording rules (charts/llm-operator/monitoring/recording-rules.yaml, the single source) with rate
windows scaled to its short scrape interval. The adapter serves the chart's adapter rules
(adapter-rules.yaml) as they are. The APIServices are registered only once the adapter answers and
are removed first on the way down: an unavailable APIService breaks discovery and garbage
collection for everyone.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from e2e.cluster import kubeconfig, netns
from e2e.cluster import node as node_mod
from e2e.cluster import pki as pki_mod
from e2e.cluster.state import REPO_ROOT, StateDir

# Processes, in start order (the forwarder is forwarder.py, matched by its stem).
COMPONENTS = ("prometheus", "prometheus-forwarder", "prometheus-adapter")
BINARIES = ("prometheus", "promtool", "prometheus-adapter")
NAMESPACE = "monitoring"
PROMETHEUS_PORT = 9090
ADAPTER_PORT = 4443  # on the node address; its Service listens on 443
PROMETHEUS_URL = f"http://prometheus.{NAMESPACE}.svc:{PROMETHEUS_PORT}"

# Test-speed timings (production: 15 s scrapes, 1 m rate windows, 10 min relist). The HPA's own
# sync period (2 s) is the controller manager's flag (flags.py).
SCRAPE_INTERVAL_S = 2
RATE_WINDOW_S = 4 * SCRAPE_INTERVAL_S  # a rate needs >= 2 samples; 4 tolerate a missed scrape
ADAPTER_RELIST_S = 2
# The adapter lists series seen within this window; longer than the relist so that a series whose
# latest sample is a scrape or two old does not flicker out of the list.
ADAPTER_MAX_AGE_S = 20

RULES_DIR = REPO_ROOT / "charts" / "llm-operator" / "monitoring"
RECORDING_RULES = RULES_DIR / "recording-rules.yaml"
ADAPTER_RULES = RULES_DIR / "adapter-rules.yaml"
CUSTOM_METRICS_GROUP = "custom.metrics.k8s.io"
APISERVICES = tuple(f"{v}.{CUSTOM_METRICS_GROUP}" for v in ("v1beta1", "v1beta2"))

# Serving pods, as the operator labels them (operator/llm_operator/labels.py): leaders serve the
# metrics (single-pod replicas are leaders).
SERVING_SELECTOR = "llmoperator.io/deployment,llmoperator.io/role=leader"
POD_TARGET_LABELS = ("llmoperator.io/deployment", "llmoperator.io/revision", "llmoperator.io/role")
# Router pods (render/router/objects.py router_pod_labels): their picker's metrics port.
ROUTER_SELECTOR = "app.kubernetes.io/name=llm-operator,app.kubernetes.io/component=router"
ROUTER_TARGET_LABELS = ("app.kubernetes.io/instance",)


def _sanitized(label: str) -> str:
    """A pod label as Prometheus names it (what PodMonitor podTargetLabels produce)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def _cidr_regex(cidr: str) -> str:
    """A relabel regex matching the addresses of a /24 (fully anchored by Prometheus)."""
    prefix, bits = cidr.split("/")
    assert bits == "24", cidr
    return re.escape(prefix.rsplit(".", 1)[0] + ".") + r"\d+"


def recording_rules(source: str, window_s: int = RATE_WINDOW_S, interval_s: int = SCRAPE_INTERVAL_S) -> str:
    """The chart's recording rules with every rate window and group interval scaled to the test
    world's scrape interval (the rule file says consumers do exactly this)."""
    doc = yaml.safe_load(source)
    for group in doc["groups"]:
        group["interval"] = f"{interval_s}s"
        for rule in group["rules"]:
            rule["expr"] = re.sub(r"\[1m\]", f"[{window_s}s]", rule["expr"])
    return yaml.safe_dump(doc, sort_keys=False)


def _pod_job(
    name: str, selector: str, port: str, labels: tuple[str, ...], kubeconfig_file: Path
) -> dict[str, Any]:
    """A scrape job over the pods `selector` picks on the real node, port `port`, with `labels`
    copied from the pods, as a PodMonitor with those podTargetLabels would make it."""
    relabel: list[dict[str, Any]] = [
        {
            "action": "keep",
            "source_labels": ["__meta_kubernetes_pod_container_port_name"],
            "regex": port,
        },
        # Only the real node's pods exist as addresses: KWOK's pods have fake IPs nobody may dial.
        {
            "action": "keep",
            "source_labels": ["__meta_kubernetes_pod_ip"],
            "regex": _cidr_regex(node_mod.POD_CIDR),
        },
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "Succeeded|Failed"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        *(
            {
                "source_labels": [f"__meta_kubernetes_pod_label_{_sanitized(label)}"],
                "target_label": _sanitized(label),
            }
            for label in labels
        ),
        # What prometheus-operator names a PodMonitor's job: <namespace>/<name>.
        {"target_label": "job", "replacement": f"{NAMESPACE}/{name}"},
    ]
    return {
        "job_name": name,
        "kubernetes_sd_configs": [
            {
                "role": "pod",
                "kubeconfig_file": str(kubeconfig_file),
                # Watch only the real node's pods: KWOK's never become targets.
                "selectors": [
                    {"role": "pod", "label": selector, "field": f"spec.nodeName={pki_mod.NODE_NAME}"}
                ],
            }
        ],
        "relabel_configs": relabel,
    }


def prometheus_config(kubeconfig_file: Path, rules_file: Path) -> dict[str, Any]:
    return {
        "global": {
            "scrape_interval": f"{SCRAPE_INTERVAL_S}s",
            "scrape_timeout": f"{SCRAPE_INTERVAL_S}s",
            "evaluation_interval": f"{SCRAPE_INTERVAL_S}s",
        },
        "rule_files": [str(rules_file)],
        "scrape_configs": [
            _pod_job("llm-operator-serving", SERVING_SELECTOR, "metrics", POD_TARGET_LABELS, kubeconfig_file),
            # The routers' endpoint pickers: their flow-control queue wakes a deployment at zero
            # replicas (KEDA's wake trigger, render/scale_to_zero.py).
            _pod_job(
                "llm-operator-router",
                ROUTER_SELECTOR,
                "picker-metrics",
                ROUTER_TARGET_LABELS,
                kubeconfig_file,
            ),
        ],
    }


def in_cluster_service(
    name: str, port: int, target_port: int, namespace: str = NAMESPACE
) -> list[dict[str, Any]]:
    """A selector-less Service and its EndpointSlice pointing at a process on the node address."""
    meta = {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/name": name}}
    port_name = "https" if port == 443 else "http"
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta,
            "spec": {
                "ports": [{"name": port_name, "port": port, "targetPort": target_port, "protocol": "TCP"}]
            },
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {
                    "kubernetes.io/service-name": name,
                    "endpointslice.kubernetes.io/managed-by": "e2e-cluster.llmoperator.io",
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [netns.NODE_IP], "conditions": {"ready": True}}],
            "ports": [{"name": port_name, "port": target_port, "protocol": "TCP"}],
        },
    ]


def binding(
    kind: str, name: str, role_kind: str, role: str, user: str, namespace: str = ""
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }


def _reader(name: str, resources: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": [{"apiGroups": [""], "resources": resources, "verbs": ["get", "list", "watch"]}],
    }


def cluster_objects() -> list[dict[str, Any]]:
    """The namespace, the Services and least-privilege RBAC for both identities (pki.CLIENTS)."""
    prom, adapter = pki_mod.CLIENTS["prometheus"][0], pki_mod.CLIENTS["prometheus-adapter"][0]
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        *in_cluster_service("prometheus", PROMETHEUS_PORT, PROMETHEUS_PORT),
        *in_cluster_service("prometheus-adapter", 443, ADAPTER_PORT),
        # Pod discovery.
        _reader(prom, ["pods"]),
        binding("ClusterRoleBinding", prom, "ClusterRole", prom, prom),
        # The adapter's pod and node informers and its resource lookups; delegated authn/authz and
        # the front-proxy CA (extension-apiserver-authentication) as every aggregated API server.
        _reader(adapter, ["pods", "nodes", "namespaces", "services"]),
        binding("ClusterRoleBinding", adapter, "ClusterRole", adapter, adapter),
        binding(
            "ClusterRoleBinding", f"{adapter}:auth-delegator", "ClusterRole", "system:auth-delegator", adapter
        ),
        binding(
            "RoleBinding",
            f"{adapter}:auth-reader",
            "Role",
            "extension-apiserver-authentication-reader",
            adapter,
            "kube-system",
        ),
    ]


def apiservices(ca_bundle: bytes) -> list[dict[str, Any]]:
    """custom.metrics.k8s.io v1beta1 and v1beta2 served by the adapter, its cert checked against
    the cluster CA (what a production chart does, rather than insecureSkipTLSVerify)."""
    return [
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": name},
            "spec": {
                "service": {"name": "prometheus-adapter", "namespace": NAMESPACE, "port": 443},
                "group": CUSTOM_METRICS_GROUP,
                "version": name.split(".", 1)[0],
                "caBundle": base64.b64encode(ca_bundle).decode(),
                "groupPriorityMinimum": 100,
                "versionPriority": 200 if name.startswith("v1beta2") else 100,
            },
        }
        for name in APISERVICES
    ]


def _path(obj: dict[str, Any]) -> str:
    """The collection URL of a manifest (the kinds above only)."""
    api, kind = obj["apiVersion"], obj["kind"]
    plural = {"EndpointSlice": "endpointslices", "APIService": "apiservices"}.get(
        kind, kind.lower() + ("es" if kind.endswith("s") else "s")
    )
    prefix = "/api/v1" if api == "v1" else f"/apis/{api}"
    ns = obj["metadata"].get("namespace")
    return f"{prefix}/namespaces/{ns}/{plural}" if ns else f"{prefix}/{plural}"


# -- the processes -----------------------------------------------------------------------------------
Request = Callable[[str, str, Any], tuple[int, Any]]


def create(request: Request, objs: list[dict[str, Any]]) -> None:
    for obj in objs:
        code, body = request("POST", _path(obj), obj)
        if code not in (201, 409):
            raise RuntimeError(
                f"creating {obj['kind']} {obj['metadata']['name']} failed: HTTP {code}: {body}"
            )


def prepare(state: StateDir, pki: pki_mod.Pki, request: Request) -> dict[str, list[str]]:
    """Write configs, kubeconfigs and the adapter's serving cert, create the cluster objects;
    returns each process's arguments (the forwarder's are the launcher's)."""
    root = state.root / "monitoring"
    root.mkdir(parents=True, exist_ok=True)
    kcs = {}
    for client in ("prometheus", "prometheus-adapter"):
        kcs[client] = state.component_kubeconfig(client)
        kubeconfig.write(kcs[client], node_mod.APISERVER_PORT, pki, client, host=netns.NODE_IP)
    rules = root / "recording-rules.yaml"
    rules.write_text(recording_rules(RECORDING_RULES.read_text()))
    config = root / "prometheus.yml"
    config.write_text(yaml.safe_dump(prometheus_config(kcs["prometheus"], rules), sort_keys=False))
    serving = pki_mod.issue_server_cert(
        state.pki_dir,
        "prometheus-adapter",
        [f"prometheus-adapter.{NAMESPACE}.svc", f"prometheus-adapter.{NAMESPACE}.svc.cluster.local"],
    )
    create(request, cluster_objects())
    adapter_kc = kcs["prometheus-adapter"]
    return {
        "prometheus": [
            f"--config.file={config}",
            f"--storage.tsdb.path={root / 'tsdb'}",
            "--storage.tsdb.retention.time=6h",
            f"--web.listen-address={netns.NODE_IP}:{PROMETHEUS_PORT}",
        ],
        "prometheus-adapter": [
            f"--bind-address={netns.NODE_IP}",
            f"--secure-port={ADAPTER_PORT}",
            f"--tls-cert-file={serving.cert}",
            f"--tls-private-key-file={serving.key}",
            f"--cert-dir={root / 'adapter-certs'}",
            f"--lister-kubeconfig={adapter_kc}",
            f"--authentication-kubeconfig={adapter_kc}",
            f"--authorization-kubeconfig={adapter_kc}",
            f"--prometheus-url=http://{netns.NODE_IP}:{PROMETHEUS_PORT}/",
            f"--config={ADAPTER_RULES}",
            f"--metrics-relist-interval={ADAPTER_RELIST_S}s",
            f"--metrics-max-age={ADAPTER_MAX_AGE_S}s",
        ],
    }


def finish(
    request: Request,
    pki: pki_mod.Pki,
    inside: Callable[[str], Callable[[], bool]],
    wait_ready: Callable[[str, Callable[[], bool], str], None],
) -> None:
    """Wait for Prometheus and the adapter (`inside(url)`: a probe from inside the namespace;
    `wait_ready(what, probe, component)` fails naming the component), then register the custom
    metrics APIServices and wait until both are Available."""
    prometheus = f"http://{netns.NODE_IP}:{PROMETHEUS_PORT}/-/ready"
    wait_ready("Prometheus /-/ready", inside(prometheus), "prometheus")
    adapter = f"https://{netns.NODE_IP}:{ADAPTER_PORT}/readyz"
    wait_ready("prometheus-adapter /readyz", inside(adapter), "prometheus-adapter")
    create(request, apiservices(pki.ca.cert.read_bytes()))
    wait_ready("the custom metrics APIServices Available", lambda: available(request), "prometheus-adapter")


def available(request: Request) -> bool:
    """Both APIServices Available (the aggregator reached the adapter) and the API discoverable."""
    for name in APISERVICES:
        code, body = request("GET", f"/apis/apiregistration.k8s.io/v1/apiservices/{name}", None)
        conditions = body.get("status", {}).get("conditions", []) if code == 200 else []
        if not any(c["type"] == "Available" and c["status"] == "True" for c in conditions):
            return False
    return request("GET", f"/apis/{CUSTOM_METRICS_GROUP}/v1beta2", None)[0] == 200


def unregister(request: Request) -> None:
    """Remove the APIServices (before the adapter stops); absent ones are fine."""
    for name in APISERVICES:
        request("DELETE", f"/apis/apiregistration.k8s.io/v1/apiservices/{name}", None)
