"""The routing test world (e2e/cluster/routing.py) that `spec.routing.mode: inference-pool` runs on:
the Gateway API Inference Extension's CRDs are served, and the endpoint picker's and Envoy's images
run on the real node under the exact names the operator defaults to, without any pull
(imagePullPolicy Never), in a Pod Security `restricted` namespace.

A router pod's Envoy reaches model servers two ways, both shown here with the real Envoy: by pod IP
(the picker's choice, pod to pod) and by the client Service's name (FailOpen's fallback, a
STRICT_DNS cluster resolving `<service>.<namespace>.svc` through the node's CoreDNS).
"""

from __future__ import annotations

import functools
import http.client
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster import Cluster, busybox_image, routing
from e2e.cluster.pki import NODE_NAME
from e2e.cluster.testing import E2ECluster, Kubectl, KubectlError, pod_ready, wait_for
from e2e.generate import connection

pytestmark = pytest.mark.e2e

GROUP = "inference.networking.k8s.io"
WEB_IMAGE = "localhost/llm-operator/busybox:e2e"
NOBODY = 65534
# What `restricted` demands of every container, and read-only roots as the router pod will have.
CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
}
POD_SECURITY = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
ENVOY_PORT, ENVOY_READY_PORT = 8080, 19001


def _launcher(cluster: E2ECluster) -> Cluster:
    if cluster.launcher is None:
        pytest.skip("the router's images are imported into the embedded cluster's real node")
    return cluster.launcher


def _pod(name: str, containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    for container in containers:
        container.setdefault("imagePullPolicy", "Never")  # only what `up` imported may run
        container["securityContext"] = CONTAINER_SECURITY
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE_NAME},
            "securityContext": POD_SECURITY,
            "containers": containers,
            "terminationGracePeriodSeconds": 1,
            **spec,
        },
    }


def _pool() -> dict[str, Any]:
    """A minimal InferencePool `tiny`: pods labelled app=tiny on 8080, picked by `tiny-router`."""
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "InferencePool",
        "metadata": {"name": "tiny"},
        "spec": {
            "selector": {"matchLabels": {"app": "tiny"}},
            "targetPorts": [{"number": 8080}],
            "endpointPickerRef": {"name": "tiny-router", "port": {"number": 9002}, "failureMode": "FailOpen"},
        },
    }


def test_inference_pool_v1_is_served_and_validated(kubectl: Kubectl, namespace: str) -> None:
    """InferencePool v1 is in discovery with the alpha kinds the picker watches, a minimal pool is
    accepted with the CRD's defaults, and the CRD's own CEL rule refuses a picker without a port."""

    def served(group_version: str) -> set[str]:
        return {
            r["name"]
            for r in json.loads(kubectl("get", "--raw", f"/apis/{group_version}").stdout)["resources"]
        }

    assert "inferencepools" in served(f"{GROUP}/v1")
    assert {"inferenceobjectives", "inferencemodelrewrites"} <= served(
        "inference.networking.x-k8s.io/v1alpha2"
    )

    pool = _pool()
    picker = pool["spec"]["endpointPickerRef"]
    kubectl.apply(pool, namespace)
    stored = kubectl.get("inferencepool", "tiny", namespace)
    assert stored is not None
    assert stored["spec"]["endpointPickerRef"] == {**picker, "kind": "Service", "group": ""}
    assert stored["spec"]["targetPorts"] == [{"number": 8080}]
    assert stored["spec"]["appProtocol"] == "http"

    portless = {**pool, "metadata": {"name": "portless"}}
    portless["spec"] = {**pool["spec"], "endpointPickerRef": {"name": "tiny-router"}}
    with pytest.raises(KubectlError, match="port is required when kind is 'Service'"):
        kubectl.apply(portless, namespace)


def test_router_images_run_under_the_operators_default_names(
    cluster: E2ECluster, kubectl: Kubectl, namespace: str
) -> None:
    """Envoy 1.40.0 and the EPP v1.5.0 start from the images `up` imported, as non-root with
    read-only roots: `envoy --version` and `epp --help` both exit 0."""
    _launcher(cluster)
    pod = _pod(
        "versions",
        [
            {"name": "envoy", "image": routing.ENVOY_IMAGE, "args": ["--version"]},
            {"name": "epp", "image": routing.EPP_IMAGE, "args": ["--help"]},
        ],
        restartPolicy="Never",
    )
    kubectl.apply(pod, namespace)
    done = wait_for(
        "pod versions to finish",
        lambda: kubectl.get("pod", "versions", namespace),
        lambda p: p is not None and p["status"].get("phase") in ("Succeeded", "Failed"),
        timeout=90,
    )
    assert done is not None
    states = {s["name"]: s["state"] for s in done["status"]["containerStatuses"]}
    assert done["status"]["phase"] == "Succeeded", states
    envoy = kubectl("logs", "versions", "-c", "envoy", namespace=namespace).stdout
    assert "/1.40.0/Clean/RELEASE/BoringSSL" in envoy
    epp = kubectl("logs", "versions", "-c", "epp", namespace=namespace).stdout
    assert '"build-ref":"v1.5.0"' in epp and "--pool-name string" in epp


def test_epp_serves_its_pool_with_read_only_rbac(
    cluster: E2ECluster, kubectl: Kubectl, namespace: str
) -> None:
    """The EPP image, given `--pool-name`, watches its InferencePool and the alpha kinds beside the
    pods (GIE v1.5.0 cmd/epp/runner/runner.go starts those reconcilers unless --endpoint-selector is
    used) and turns Ready on its gRPC health port once the pool is synced, with nothing but read
    access to those kinds in its namespace."""
    _launcher(cluster)
    read = ["get", "list", "watch"]
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "epp"},
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": read},
            {"apiGroups": [GROUP], "resources": ["inferencepools"], "verbs": read},
            {
                "apiGroups": ["inference.networking.x-k8s.io"],
                "resources": ["inferenceobjectives", "inferencemodelrewrites"],
                "verbs": read,
            },
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "epp"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "epp"},
        "subjects": [{"kind": "ServiceAccount", "name": "epp", "namespace": namespace}],
    }
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "epp"}}
    epp = _pod(
        "epp",
        [
            {
                "name": "epp",
                "image": routing.EPP_IMAGE,
                # The metrics endpoint's own authentication needs cluster-wide TokenReviews: not here.
                "args": [
                    "--pool-name",
                    "tiny",
                    "--pool-namespace",
                    namespace,
                    "--metrics-endpoint-auth=false",
                ],
                # As GIE v1.5.0's config/charts/epplib/templates/_deployment.yaml probes one replica.
                "readinessProbe": {
                    "grpc": {"port": 9003, "service": "inference-extension"},
                    "periodSeconds": 1,
                },
            }
        ],
        serviceAccountName="epp",
    )
    kubectl.apply([_pool(), account, role, binding, epp], namespace)
    wait_for(
        "pod epp Ready (its pool synced)",
        lambda: kubectl.get("pod", "epp", namespace),
        pod_ready,
        timeout=90,
    )
    logs = kubectl("logs", "epp", namespace=namespace).stdout
    assert "forbidden" not in logs.lower(), logs[-2000:]


def _envoy_config(namespace: str, pod_ip: str) -> dict[str, Any]:
    """A listener routing /svc/ to Service `web` by name (STRICT_DNS, as FailOpen's fallback does)
    and /pod/ to the web pod's IP, and a readiness listener."""

    def cluster(name: str, kind: str, address: str, port: int) -> dict[str, Any]:
        endpoint = {"endpoint": {"address": {"socket_address": {"address": address, "port_value": port}}}}
        return {
            "name": name,
            "type": kind,
            "dns_lookup_family": "V4_ONLY",
            "connect_timeout": "2s",
            "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [endpoint]}]},
        }

    def listener(name: str, port: int, routes: list[dict[str, Any]]) -> dict[str, Any]:
        manager = {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
            ".HttpConnectionManager",
            "stat_prefix": name,
            "route_config": {"virtual_hosts": [{"name": name, "domains": ["*"], "routes": routes}]},
            "http_filters": [
                {
                    "name": "envoy.filters.http.router",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                    },
                }
            ],
        }
        return {
            "name": name,
            "address": {"socket_address": {"address": "0.0.0.0", "port_value": port}},
            "filter_chains": [
                {
                    "filters": [
                        {"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}
                    ]
                }
            ],
        }

    return {
        "static_resources": {
            "listeners": [
                listener(
                    "openai",
                    ENVOY_PORT,
                    [
                        {
                            "match": {"prefix": "/svc/"},
                            "route": {"cluster": "service", "prefix_rewrite": "/"},
                        },
                        {"match": {"prefix": "/pod/"}, "route": {"cluster": "pod", "prefix_rewrite": "/"}},
                    ],
                ),
                listener(
                    "ready",
                    ENVOY_READY_PORT,
                    [{"match": {"path": "/ready"}, "direct_response": {"status": 200}}],
                ),
            ],
            "clusters": [
                cluster("service", "STRICT_DNS", f"web.{namespace}.svc", 80),
                cluster("pod", "STATIC", pod_ip, 8080),
            ],
        }
    }


def _get(netns: str, ip: str, path: str) -> tuple[int, str]:
    conn = connection(ip, ENVOY_PORT, inside=netns, timeout=5)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode(errors="replace")
    except (OSError, http.client.HTTPException) as e:
        return 0, f"{type(e).__name__}: {e}"
    finally:
        conn.close()


def test_envoy_reaches_a_pod_by_ip_and_a_service_by_its_svc_name(
    cluster: E2ECluster, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    """The router pod's two paths, through the real Envoy in its image: to a model server's pod IP
    (the node's pod network, pod to pod) and to a Service by `<name>.<namespace>.svc` (CoreDNS,
    through the pod's resolv.conf search path)."""
    launcher = _launcher(cluster)
    launcher.import_image(busybox_image.write(tmp_path / "web.oci.tar", WEB_IMAGE, ["/bin/sh"]))
    web = _pod(
        "web",
        [
            {
                "name": "web",
                "image": WEB_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": ["/bin/httpd", "-f", "-p", "8080", "-h", "/www"],
                "ports": [{"containerPort": 8080}],
                "readinessProbe": {"httpGet": {"path": "/index.html", "port": 8080}, "periodSeconds": 1},
            }
        ],
        securityContext={**POD_SECURITY, "runAsUser": NOBODY, "runAsGroup": NOBODY},
    )
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    kubectl.apply([web, service], namespace)
    ready = wait_for("pod web Ready", lambda: kubectl.get("pod", "web", namespace), pod_ready, timeout=90)
    assert ready is not None
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "envoy"},
        "data": {"envoy.yaml": yaml.safe_dump(_envoy_config(namespace, ready["status"]["podIP"]))},
    }
    envoy = _pod(
        "envoy",
        [
            {
                "name": "envoy",
                "image": routing.ENVOY_IMAGE,  # its default command: -c /etc/envoy/envoy.yaml
                "ports": [{"containerPort": ENVOY_PORT}],
                "readinessProbe": {
                    "httpGet": {"path": "/ready", "port": ENVOY_READY_PORT},
                    "periodSeconds": 1,
                },
                "volumeMounts": [{"name": "config", "mountPath": "/etc/envoy"}],
            }
        ],
        volumes=[{"name": "config", "configMap": {"name": "envoy"}}],
    )
    kubectl.apply([config, envoy], namespace)
    pod = wait_for("pod envoy Ready", lambda: kubectl.get("pod", "envoy", namespace), pod_ready, timeout=90)
    assert pod is not None
    ip = pod["status"]["podIP"]
    for path in ("/pod/index.html", "/svc/index.html"):
        # Envoy resolves the name in the background after it starts: 503 until then.
        wait_for(
            f"GET {path} answered through Envoy",
            functools.partial(_get, launcher.netns, ip, path),
            lambda r: r == (200, "ok\n"),
            timeout=30,
        )
