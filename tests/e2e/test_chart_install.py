"""`helm install` of the chart into the embedded cluster succeeds and the operator pod runs."""

from __future__ import annotations

import pytest

from e2e.cluster.testing import E2ECluster, Kubectl, pod_ready, wait_for
from tests.unit.test_chart import CHART, helm

pytestmark = pytest.mark.e2e


def test_helm_install_and_uninstall(crd: None, cluster: E2ECluster, kubectl: Kubectl, namespace: str) -> None:
    kubeconfig = f"--kubeconfig={cluster.kubeconfig}"
    # The CRD is cluster-scoped and already installed by the session: Helm must not fight over it.
    result = helm("install", "llmop", str(CHART), "--namespace", namespace, "--skip-crds", kubeconfig,
                  "--set", "nodeSelector.kubernetes\\.io/os=linux", check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    try:
        pods = wait_for(
            "the operator pod Running (KWOK runs no image, the scheduler and kubelet stand-in do)",
            lambda: kubectl.items("pods", namespace, "app.kubernetes.io/instance=llmop"),
            lambda items: len(items) == 1 and pod_ready(items[0]),
            timeout=60,
        )
        assert pods[0]["spec"]["serviceAccountName"] == "llmop-llm-operator"
        assert kubectl.get("clusterrolebinding", "llmop-llm-operator") is not None
    finally:
        uninstall = helm("uninstall", "llmop", "--namespace", namespace, kubeconfig, check=False)
        assert uninstall.returncode == 0, uninstall.stderr
    assert kubectl.get("clusterrole", "llmop-llm-operator") is None
