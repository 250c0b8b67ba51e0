"""The NetworkPolicy of an LLMDeployment on the real API server and a real serving pod.

What this proves: the API server accepts the policy the operator renders (its own validation, not
a schema copy), with the operator's metrics peers as the e2e world configures them; its
podSelector selects the live serving pod; that pod becomes Ready and serves under it; switching
`spec.networkPolicy.enabled` off deletes the policy (pruned like any child) without restarting the
pod, and switching it back on restores it.

What it cannot prove here: enforcement. The real node's bridge CNI implements no NetworkPolicy and
the kernel lacks what kube-network-policies needs (docs/development.md), so reachability of 8002
and 2222 is pinned by tests/unit/test_network_policy.py instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster.netns import NODE_IP
from e2e.cluster.testing import E2ECluster, Kubectl, is_true, wait_for
from e2e.generate import connection, stream

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAME = "tiny-llama"
SELECTOR = f"llmoperator.io/deployment={NAME}"


def tiny_llama(enabled: bool) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / "cpu-reference.yaml").read_text())
    doc["spec"]["resources"]["cpu"] = "250m"
    doc["spec"]["networkPolicy"] = {"enabled": enabled}
    return doc


def selected(kubectl: Kubectl, ns: str, policy: dict[str, Any]) -> set[str]:
    labels = ",".join(f"{k}={v}" for k, v in policy["spec"]["podSelector"]["matchLabels"].items())
    return {p["metadata"]["name"] for p in kubectl.items("pods", ns, labels)}


@pytest.fixture(scope="module")
def namespace(operator: None, cluster: E2ECluster, kubectl: Kubectl) -> Iterator[str]:
    if cluster.launcher is None:
        pytest.skip("needs the embedded cluster: its real node runs the serving pod")
    ns = kubectl.create_namespace("netpol")
    try:
        yield ns
    finally:
        kubectl.delete("namespace", ns)


def test_the_policy_covers_the_live_pod_and_goes_when_switched_off(
    namespace: str, cluster: E2ECluster, kubectl: Kubectl
) -> None:
    assert cluster.launcher is not None
    kubectl.apply(tiny_llama(enabled=True), namespace=namespace)
    wait_for(
        f"{NAME} Ready",
        lambda: kubectl.get("llmdeployment", NAME, namespace),
        lambda d: d is not None and is_true(d, "Ready"),
        timeout=240,
    )
    policy = kubectl.get("networkpolicy", NAME, namespace)
    assert policy is not None, "the operator applies the policy by default"
    (pod,) = kubectl.items("pods", namespace, SELECTOR)
    assert selected(kubectl, namespace, policy) == {pod["metadata"]["name"]}
    rules = policy["spec"]["ingress"]
    metrics = {"from": [{"ipBlock": {"cidr": f"{NODE_IP}/32"}}], "ports": [{"port": 8002, "protocol": "TCP"}]}
    assert metrics in rules, "the e2e world's Prometheus: a process on the node address"
    # Served under the policy, through the Service (kube-proxy) from the cluster's network.
    service = kubectl.get("service", NAME, namespace)
    assert service is not None
    chunks = list(stream(connection(service["spec"]["clusterIP"], inside=cluster.launcher.netns), "Once", 8))
    assert len(chunks) == 8

    sts = kubectl.get("statefulset", NAME, namespace)
    assert sts is not None
    kubectl.apply(tiny_llama(enabled=False), namespace=namespace)
    wait_for(
        "the NetworkPolicy deleted",
        lambda: kubectl.get("networkpolicy", NAME, namespace),
        lambda p: p is None,
        timeout=60,
    )
    # The pass that pruned it applied the workloads first: a new revision would show by now.
    after = kubectl.get("statefulset", NAME, namespace)
    assert after is not None
    assert after["metadata"]["generation"] == sts["metadata"]["generation"], "the pods are not rolled"
    (still,) = kubectl.items("pods", namespace, SELECTOR)
    assert still["metadata"]["uid"] == pod["metadata"]["uid"]

    kubectl.apply(tiny_llama(enabled=True), namespace=namespace)
    wait_for(
        "the NetworkPolicy back",
        lambda: kubectl.get("networkpolicy", NAME, namespace),
        lambda p: p is not None,
        timeout=60,
    )
