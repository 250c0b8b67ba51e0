"""Autoscaling on real pods: Triton's queue -> Prometheus (Kubernetes discovery, the chart's
recording rules) -> prometheus-adapter (custom.metrics.k8s.io through the aggregation layer) -> the
real HPA controller -> the LLMDeployment's scale subresource -> the operator -> a new replica that
becomes Ready and takes traffic; then back down, without a failed request.

Needs the embedded cluster (its monitoring stack and the real node); the cpu-reference pods request
250m CPU so three fit on the real node.
"""

from __future__ import annotations

import time

import pytest

from e2e.cluster import scaling
from e2e.cluster.testing import E2ECluster, Kubectl, condition, pod_ready, wait_for
from tests.e2e.test_operator import example, wait_ready

pytestmark = [pytest.mark.e2e, pytest.mark.exclusive]  # cuts Prometheus off, which other modules query
HOLD_S = 30


def test_queue_load_scales_up_serves_and_scales_back_down(
    operator: None, embedded: E2ECluster, kubectl: Kubectl, namespace: str
) -> None:
    assert embedded.launcher is not None
    # On the LLM API contract (the pytorch backend's shape): its queue is the gauge the operator's
    # llmapi wrapper sets from the engine's iteration stats, since Triton's own stays near 0 there.
    doc = scaling.autoscaled(example("cpu-reference.yaml"))
    doc["spec"]["engine"]["cpuReference"] = {"contract": "pytorch"}
    kubectl.apply(doc, namespace=namespace)
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
    wait_for(
        "the LLMDeployment to report its autoscaler reading the metric",
        lambda: condition(kubectl.get("llmdeployment", "tiny-llama", namespace), "AutoscalingActive"),
        lambda c: c is not None and c["reason"] == "MetricAvailable",
        timeout=30,
    )

    timeline = scaling.run(
        kubectl, embedded.launcher.netns, embedded.launcher.prometheus_url, namespace, "tiny-llama"
    )
    assert timeline.replicas_asked in (2, 3)
    assert timeline.new_pod_served > 0
    assert timeline.stats.failed == 0, timeline.stats.errors
    assert timeline.stats.ok > 0


def test_without_prometheus_the_replica_count_stays(
    operator: None, embedded: E2ECluster, kubectl: Kubectl, namespace: str
) -> None:
    """No metric is no decision: two idle replicas stay two while Prometheus is unreachable (the
    HPA says why), and go down to one once it is back (what it would have done all along)."""
    assert embedded.launcher is not None
    doc = scaling.autoscaled(example("cpu-reference.yaml"))
    doc["spec"]["replicas"] = 2
    with scaling.prometheus_unreachable(embedded.launcher.netns):
        kubectl.apply(doc, namespace=namespace)
        hpa = wait_for(
            "the HPA failing to get its metric",
            lambda: kubectl.get("hpa", "tiny-llama", namespace),
            lambda h: (condition(h, "ScalingActive") or {}).get("reason") == "FailedGetPodsMetric",
            timeout=120,
        )
        wait_for(
            "both replicas Ready (with Prometheus there, their metrics would now scale them down)",
            lambda: scaling.serving_pods(kubectl, namespace, "tiny-llama"),
            lambda pods: len(pods) == 2 and all(pod_ready(p) for p in pods),
            timeout=240,
        )
        # Longer than the scale-down stabilization window and many HPA syncs.
        deadline = time.monotonic() + HOLD_S
        while time.monotonic() < deadline:
            ld = kubectl.get("llmdeployment", "tiny-llama", namespace)
            assert ld is not None and ld["spec"]["replicas"] == 2
            time.sleep(1)
        hpa = kubectl.get("hpa", "tiny-llama", namespace)
        assert (condition(hpa, "ScalingActive") or {}).get("status") == "False", hpa
        # The LLMDeployment says which metric is missing and why.
        active = condition(kubectl.get("llmdeployment", "tiny-llama", namespace), "AutoscalingActive")
        assert active is not None and active["status"] == "False", active
        # Which one depends on whether the adapter listed the series before Prometheus went away.
        assert active["reason"] in ("MetricNotFound", "NoMetricData", "MetricUnavailable"), active
        print(f"AutoscalingActive while Prometheus is unreachable: {active['reason']}: {active['message']}")
        assert "triton_pending_requests" in active["message"] and "Replicas stay" in active["message"]
    back = time.monotonic()
    wait_for(
        "the HPA to scale the idle deployment down once metrics are back",
        lambda: kubectl.get("llmdeployment", "tiny-llama", namespace),
        lambda o: o is not None and o["spec"]["replicas"] == 1,
        timeout=120,
    )
    # Within the hold above: had the metric been there, the hold would have seen the change.
    assert time.monotonic() - back < HOLD_S
