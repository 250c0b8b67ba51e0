"""The NetworkPolicy of an LLMDeployment on the real API server and a real serving pod, enforced by
the test world's enforcer (kube-router's network policy controller, e2e/cluster/enforcer.py).

What this proves: the API server accepts the policy the operator renders, with the operator's
metrics peers as the e2e world configures them; its podSelector selects the live serving pod; under
it a client pod in another namespace reaches Triton's client port 8000 but not its metrics port
8002, while Prometheus (the metrics peer, a process on the node address) still scrapes 8002;
switching `spec.networkPolicy.enabled` off deletes the policy without restarting the pod and opens
8002 to the client; a clientNamespaceSelector that excludes the client's namespace cuts it off
8000 too. Sources on the node itself are admitted whatever the policy says (kube-router admits a
pod's own node, as kubelet probes need): Prometheus's scrape shows that the policy does not cut the
monitoring path, not that the ipBlock rule is what admits it.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster import busybox_image
from e2e.cluster.netns import NODE_IP
from e2e.cluster.pki import NODE_NAME
from e2e.cluster.testing import E2ECluster, Kubectl, is_true, pod_ready, wait_for
from e2e.generate import connection, stream

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAME = "tiny-llama"
SELECTOR = f"llmoperator.io/deployment={NAME}"
CLIENT_IMAGE = "localhost/llm-operator/busybox:e2e"
PROBE_TIMEOUT_S = 3  # nc gives up then on a dropped SYN; an open port answers in milliseconds
# kube-router applies a policy change within a second or two of the watch event.
ENFORCED_WITHIN_S = 30


def tiny_llama(enabled: bool, client_namespaces: dict[str, Any] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / "cpu-reference.yaml").read_text())
    doc["spec"]["resources"]["cpu"] = "250m"
    doc["spec"]["networkPolicy"] = {"enabled": enabled}
    if client_namespaces is not None:
        doc["spec"]["networkPolicy"]["clientNamespaceSelector"] = client_namespaces
    return doc


def client_pod() -> dict[str, Any]:
    """busybox on the real node that only waits: the tests run wget in it (restricted-compliant)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "client"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE_NAME},
            "terminationGracePeriodSeconds": 0,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65534,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "client",
                    "image": CLIENT_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }


@dataclass
class World:
    namespace: str  # the LLMDeployment's
    client: str  # the client pod's namespace
    netns: str
    prometheus_url: str


def selected(kubectl: Kubectl, ns: str, policy: dict[str, Any]) -> set[str]:
    labels = ",".join(f"{k}={v}" for k, v in policy["spec"]["podSelector"]["matchLabels"].items())
    return {p["metadata"]["name"] for p in kubectl.items("pods", ns, labels)}


def reaches(kubectl: Kubectl, world: World, ip: str, port: int, path: str) -> bool:
    """Whether the client pod gets HTTP 200 from ip:port within PROBE_TIMEOUT_S. (nc: busybox's
    `wget -T` crashes in the static build.)"""
    request = f"printf 'GET {path} HTTP/1.0\\r\\n\\r\\n' | nc -w {PROBE_TIMEOUT_S} {ip} {port}"
    out = kubectl("exec", "-n", world.client, "client", "--", "sh", "-c", request, check=False).stdout
    return out.split()[:2] in (["HTTP/1.1", "200"], ["HTTP/1.0", "200"])


def scraped_since(world: World, ip: str, since: float) -> bool:
    """Whether Prometheus's last scrape of ip:8002 succeeded and is newer than `since` (epoch s)."""
    with urllib.request.urlopen(f"{world.prometheus_url}/api/v1/targets", timeout=5) as r:
        targets = json.loads(r.read())["data"]["activeTargets"]
    for t in targets:
        if t["labels"].get("instance") == f"{ip}:8002":
            # RFC 3339 with nanoseconds, which fromisoformat does not take: whole seconds are enough.
            m = re.fullmatch(r"(.{19})(?:\.\d+)?(.*)", t["lastScrape"])
            assert m is not None, t["lastScrape"]
            stamp = datetime.fromisoformat(m[1] + m[2].replace("Z", "+00:00")).timestamp()
            return bool(t["health"] == "up" and stamp > since)
    return False


@pytest.fixture(scope="module")
def world(
    operator: None, cluster: E2ECluster, kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    if cluster.launcher is None:
        pytest.skip("needs the embedded cluster: its real node runs the serving pod and the enforcer")
    archive = busybox_image.write(
        tmp_path_factory.mktemp("img") / "busybox.oci.tar", CLIENT_IMAGE, ["/bin/sh"]
    )
    cluster.launcher.import_image(archive)
    ns = kubectl.create_namespace("netpol")
    client = kubectl.create_namespace("netpol-client")
    try:
        kubectl.apply(client_pod(), namespace=client)
        yield World(ns, client, cluster.launcher.netns, cluster.launcher.prometheus_url)
    finally:
        kubectl.delete("namespace", ns)
        kubectl.delete("namespace", client)


def test_the_policy_is_enforced_on_the_live_pod_and_goes_when_switched_off(
    world: World, kubectl: Kubectl
) -> None:
    ns = world.namespace
    kubectl.apply(tiny_llama(enabled=True), namespace=ns)
    wait_for(
        f"{NAME} Ready",
        lambda: kubectl.get("llmdeployment", NAME, ns),
        lambda d: d is not None and is_true(d, "Ready"),
        timeout=240,
    )
    wait_for(
        "the client pod Ready", lambda: kubectl.get("pod", "client", world.client), pod_ready, timeout=60
    )
    policy = kubectl.get("networkpolicy", NAME, ns)
    assert policy is not None, "the operator applies the policy by default"
    (pod,) = kubectl.items("pods", ns, SELECTOR)
    ip = pod["status"]["podIP"]
    assert selected(kubectl, ns, policy) == {pod["metadata"]["name"]}
    rules = policy["spec"]["ingress"]
    metrics = {"from": [{"ipBlock": {"cidr": f"{NODE_IP}/32"}}], "ports": [{"port": 8002, "protocol": "TCP"}]}
    assert metrics in rules, "the e2e world's Prometheus: a process on the node address"

    # Enforced: the client port is open to a pod of another namespace, the metrics port is not.
    assert reaches(kubectl, world, ip, 8000, "/v2/health/ready"), "client port 8000 from another namespace"
    wait_for(
        "8002 closed to the client pod",
        lambda: reaches(kubectl, world, ip, 8002, "/metrics"),
        lambda ok: not ok,
        timeout=ENFORCED_WITHIN_S,
    )
    # ...while Prometheus scrapes it, and the Service (kube-proxy) serves from the cluster's network.
    since = time.time()
    wait_for(
        "a successful scrape of 8002 under the policy", lambda: scraped_since(world, ip, since), timeout=30
    )
    service = kubectl.get("service", NAME, ns)
    assert service is not None
    chunks = list(stream(connection(service["spec"]["clusterIP"], inside=world.netns), "Once", 8))
    assert len(chunks) == 8

    sts = kubectl.get("statefulset", NAME, ns)
    assert sts is not None
    kubectl.apply(tiny_llama(enabled=False), namespace=ns)
    wait_for(
        "the NetworkPolicy deleted",
        lambda: kubectl.get("networkpolicy", NAME, ns),
        lambda p: p is None,
        timeout=60,
    )
    # The pass that pruned it applied the workloads first: a new revision would show by now.
    after = kubectl.get("statefulset", NAME, ns)
    assert after is not None
    assert after["metadata"]["generation"] == sts["metadata"]["generation"], "the pods are not rolled"
    (still,) = kubectl.items("pods", ns, SELECTOR)
    assert still["metadata"]["uid"] == pod["metadata"]["uid"]
    wait_for(
        "8002 open to the client pod without a policy",
        lambda: reaches(kubectl, world, ip, 8002, "/metrics"),
        timeout=ENFORCED_WITHIN_S,
    )

    # Client ports only from the namespaces selected: the client's is not.
    kubectl.apply(
        tiny_llama(enabled=True, client_namespaces={"matchLabels": {"serving-clients": "yes"}}), namespace=ns
    )
    wait_for(
        "the NetworkPolicy back",
        lambda: kubectl.get("networkpolicy", NAME, ns),
        lambda p: p is not None,
        timeout=60,
    )
    wait_for(
        "8000 closed to a namespace the selector leaves out",
        lambda: reaches(kubectl, world, ip, 8000, "/v2/health/ready"),
        lambda ok: not ok,
        timeout=ENFORCED_WITHIN_S,
    )
    assert not reaches(kubectl, world, ip, 8002, "/metrics")
