"""Autoscaling on real pods: Triton's queue -> Prometheus (Kubernetes discovery, the chart's
recording rules) -> prometheus-adapter (custom.metrics.k8s.io through the aggregation layer) -> the
real HPA controller -> the LLMDeployment's scale subresource -> the operator -> a new replica that
becomes Ready and takes traffic; then back down, without a failed request.

Needs the embedded cluster (its monitoring stack and the real node); the cpu-reference pods request
250m CPU so three fit on the real node.
"""

from __future__ import annotations

import pytest

from e2e.cluster import scaling
from e2e.cluster.testing import E2ECluster, Kubectl, condition, wait_for
from tests.e2e.test_operator import example, wait_ready

pytestmark = pytest.mark.e2e


@pytest.fixture
def embedded(cluster: E2ECluster) -> E2ECluster:
    if cluster.launcher is None:
        pytest.skip("needs the embedded cluster's monitoring stack")
    return cluster


def test_queue_load_scales_up_serves_and_scales_back_down(
    operator: None, embedded: E2ECluster, kubectl: Kubectl, namespace: str
) -> None:
    assert embedded.launcher is not None
    kubectl.apply(scaling.autoscaled(example("cpu-reference.yaml")), namespace=namespace)
    wait_ready(kubectl, namespace, "tiny-llama", timeout=180)

    # The HPA's metric, through the aggregation layer, once Prometheus has scraped the pod.
    values = wait_for(
        f"{scaling.METRIC} for tiny-llama in the custom metrics API",
        lambda: scaling.custom_metric(kubectl, namespace, "tiny-llama"),
        timeout=60,
    )
    assert len(values) == 1 and list(values.values()) == [0.0], values
    hpa = wait_for(
        "the HPA to read its metric (ScalingActive)",
        lambda: kubectl.get("hpa", "tiny-llama", namespace),
        lambda h: (condition(h, "ScalingActive") or {}).get("status") == "True",
        timeout=60,
    )
    assert hpa is not None and hpa["status"]["currentReplicas"] == 1

    timeline = scaling.run(
        kubectl, embedded.launcher.netns, embedded.launcher.prometheus_url, namespace, "tiny-llama"
    )
    assert timeline.replicas_asked in (2, 3)
    assert timeline.new_pod_served > 0
    assert timeline.stats.failed == 0, timeline.stats.errors
    assert timeline.stats.ok > 0
