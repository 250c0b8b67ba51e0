"""The test world's monitoring stack (e2e/cluster/monitoring.py) against the real programs:
Prometheus evaluates the chart's rules and scrapes only real pods, the custom metrics API is served
through the aggregation layer, and a monitoring component that fails stops everything with one line.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from llm_operator.render.autoscaling import METRIC_NAMES

from e2e.cluster import busybox_image, monitoring
from e2e.cluster.launcher import Cluster
from e2e.cluster.load import prometheus_query
from e2e.cluster.pki import NODE_NAME
from e2e.cluster.testing import E2ECluster, Kubectl, is_true, pod_ready, wait_for
from tests.e2e.test_cluster import NOTHING_LEFT, _leftovers, up_with_a_bad_flag

pytestmark = pytest.mark.e2e
PAUSE_IMAGE = "localhost/llm-operator/pause:dev"  # imported into the real node at `up`
REAL_POD_PREFIX = "10.244.100."  # real-0's pod CIDR
BUSYBOX_IMAGE = "localhost/llm-operator/busybox:e2e"


@pytest.fixture
def embedded(cluster: E2ECluster) -> Cluster:
    if cluster.launcher is None:
        pytest.skip("needs the embedded cluster's monitoring stack")
    return cluster.launcher


def prometheus_api(url: str, path: str) -> Any:
    with urllib.request.urlopen(f"{url}/api/v1/{path}", timeout=5) as r:
        return json.loads(r.read())["data"]


def test_prometheus_evaluates_the_charts_rules(embedded: Cluster) -> None:
    groups = prometheus_api(embedded.prometheus_url, "rules")["groups"]
    health = {rule["name"]: rule["health"] for g in groups for rule in g["rules"]}
    assert set(health) == set(METRIC_NAMES.values())
    assert "err" not in health.values(), groups
    assert prometheus_query(embedded.prometheus_url, "vector(1)") == {(): 1.0}


def _serving_pod(name: str, node: dict[str, Any]) -> dict[str, Any]:
    """A pod labelled like an operator's serving leader, with a `metrics` port (nothing listens)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"llmoperator.io/deployment": "probe", "llmoperator.io/role": "leader"},
        },
        "spec": {
            **node,
            "containers": [
                {
                    "name": "triton",
                    "image": PAUSE_IMAGE,
                    "imagePullPolicy": "IfNotPresent",
                    "ports": [{"name": "metrics", "containerPort": 8002}],
                }
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


# Its own test pods (not the operator's) run as the image's root user: baseline, not restricted.
@pytest.mark.pod_security("baseline")
def test_only_serving_pods_on_the_real_node_are_scraped(
    embedded: Cluster, cluster: E2ECluster, kubectl: Kubectl, namespace: str
) -> None:
    gpu = cluster.gpu_nodes()
    if not gpu:
        pytest.skip("no simulated GPU nodes")
    kubectl.apply(
        [
            _serving_pod("real", {"nodeSelector": {"kubernetes.io/hostname": NODE_NAME}}),
            # On a KWOK node: Running with a fake pod IP that nothing may dial.
            _serving_pod(
                "fake",
                {"nodeName": gpu[0]["metadata"]["name"], "tolerations": [{"operator": "Exists"}]},
            ),
        ],
        namespace=namespace,
    )
    fake = wait_for("the KWOK pod Running", lambda: kubectl.get("pod", "fake", namespace), pod_ready)
    assert fake is not None and not fake["status"]["podIP"].startswith(REAL_POD_PREFIX)

    def targets() -> list[dict[str, Any]]:
        return [
            t
            for t in prometheus_api(embedded.prometheus_url, "targets")["activeTargets"]
            if t["labels"].get("namespace") == namespace
        ]

    found = wait_for("the real pod as a Prometheus target", targets, timeout=30)
    assert [t["labels"]["pod"] for t in found] == ["real"]
    labels = found[0]["labels"]
    assert labels["instance"].startswith(REAL_POD_PREFIX) and labels["instance"].endswith(":8002")
    assert labels["llmoperator_io_deployment"] == "probe" and labels["llmoperator_io_role"] == "leader"
    assert labels["job"] == "monitoring/llm-operator-serving"
    for target in prometheus_api(embedded.prometheus_url, "targets")["activeTargets"]:
        assert target["labels"]["instance"].startswith(REAL_POD_PREFIX), target


# Its own test pods (not the operator's) run as the image's root user: baseline, not restricted.
@pytest.mark.pod_security("baseline")
def test_pods_reach_prometheus_by_its_service_name(
    embedded: Cluster, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    """What in-cluster consumers (KEDA's trigger, Grafana, analysis queries) use."""
    embedded.import_image(busybox_image.write(tmp_path / "busybox.oci.tar", BUSYBOX_IMAGE, ["/bin/sh"]))
    query = f"{monitoring.PROMETHEUS_URL}/api/v1/query?query=vector(7)"
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "client"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": NODE_NAME},
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "wget",
                        "image": BUSYBOX_IMAGE,
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["/bin/wget", "-q", "-O", "-", query],
                    }
                ],
            },
        },
        namespace=namespace,
    )
    pod = wait_for(
        "the client pod to finish",
        lambda: kubectl.get("pod", "client", namespace),
        lambda p: p is not None and p["status"].get("phase") in ("Succeeded", "Failed"),
        timeout=60,
    )
    logs = kubectl("logs", "client", namespace=namespace).stdout
    assert pod is not None and pod["status"]["phase"] == "Succeeded", logs
    assert json.loads(logs)["data"]["result"][0]["value"][1] == "7"


def test_custom_metrics_api_is_available_in_both_versions(embedded: Cluster, kubectl: Kubectl) -> None:
    for version in ("v1beta1", "v1beta2"):
        service = kubectl.get("apiservice", f"{version}.custom.metrics.k8s.io")
        assert is_true(service, "Available"), service
        discovery = json.loads(kubectl("get", "--raw", f"/apis/custom.metrics.k8s.io/{version}").stdout)
        assert discovery["groupVersion"] == f"custom.metrics.k8s.io/{version}"


@pytest.mark.parametrize(
    ("component", "says"),
    [
        ("prometheus", "unknown long flag '--no-such-flag'"),
        ("prometheus-adapter", "unknown flag: --no-such-flag"),
    ],
)
def test_monitoring_component_failure_stops_everything(state_dir: Path, component: str, says: str) -> None:
    state, message = up_with_a_bad_flag(state_dir, component)
    assert message.startswith(f"{component} exited with code ")
    assert says in message
    assert message.endswith(f"(log: {state / 'logs' / component}.log)")
    assert _leftovers(state) == NOTHING_LEFT
