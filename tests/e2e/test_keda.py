"""`autoscaling.provider: keda` with KEDA's real controller: KEDA v2.21.0 built from its Go module
and installed from its own manifests (e2e/cluster/keda.py) scales a cpu-reference LLMDeployment on
the real node under load, through the HPA it owns on an external metric, on the query the operator
wrote into the ScaledObject; the LLMDeployment's status reports KEDA's view of it.

Needs the embedded cluster (its monitoring stack, the real node). KEDA is built the first time a
test needs it (a warm run only checks the cache) and removed again after this module.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from typing import Any

import pytest
from llm_operator.api.v1alpha1 import AutoscalingMetric
from llm_operator.contract import OPENAI_PORT
from llm_operator.render.autoscaling import keda_query

from e2e.cluster import scaling
from e2e.cluster.load import Load, prometheus_query
from e2e.cluster.testing import E2ECluster, Kubectl, condition, is_true, wait_for
from e2e.keda_world import TIMEOUT
from tests.e2e.test_operator import example, wait_ready

# Installs KEDA's CRDs and takes the cluster's external metrics API, both cluster-wide.
pytestmark = [pytest.mark.e2e, pytest.mark.exclusive]
EXTERNAL_METRICS = "/apis/external.metrics.k8s.io/v1beta1"


def external_metric(kubectl: Kubectl, namespace: str, hpa: dict[str, Any]) -> float:
    """The value KEDA's metrics API server gives the HPA for its external metric."""
    metric = hpa["spec"]["metrics"][0]["external"]["metric"]
    selector = ",".join(f"{k}={v}" for k, v in metric["selector"]["matchLabels"].items())
    path = f"{EXTERNAL_METRICS}/namespaces/{namespace}/{metric['name']}?" + urllib.parse.urlencode(
        {"labelSelector": selector}
    )
    value = json.loads(kubectl("get", "--raw", path).stdout)["items"][0]["value"]
    return float(value[:-1]) / 1000 if value.endswith("m") else float(value)


def test_keda_scales_the_deployment_up_under_load_on_the_operators_query(
    operator: None, keda_running: None, embedded: E2ECluster, kubectl: Kubectl, namespace: str
) -> None:
    assert embedded.launcher is not None
    doc = example("cpu-reference-keda.yaml")  # pending-requests, target 4, 1..3 replicas
    name = doc["metadata"]["name"]
    kubectl.apply(doc, namespace=namespace)
    wait_ready(kubectl, namespace, name, timeout=180)

    # KEDA took the ScaledObject: Ready, and the HPA it owns reads the external metric.
    active = wait_for(
        "AutoscalingActive True from KEDA's own report (ScaledObjectReady)",
        lambda: condition(kubectl.get("llmdeployment", name, namespace), "AutoscalingActive"),
        lambda c: c is not None and c["status"] == "True",
        timeout=TIMEOUT,
    )
    assert active is not None and active["reason"] == "ScaledObjectReady", active
    scaled = kubectl.get("scaledobject", name, namespace)
    assert is_true(scaled, "Ready"), scaled
    assert scaled is not None
    query = scaled["spec"]["triggers"][0]["metadata"]["query"]
    assert query == keda_query(name, namespace, AutoscalingMetric.PENDING_REQUESTS)
    hpa = wait_for(
        "KEDA's HPA reading its external metric (ScalingActive)",
        lambda: kubectl.get("hpa", f"keda-hpa-{name}", namespace),
        lambda h: is_true(h, "ScalingActive"),
        timeout=TIMEOUT,
    )
    assert hpa is not None and hpa["spec"]["metrics"][0]["type"] == "External"
    assert kubectl.get("hpa", name, namespace) is None, "KEDA's HPA is the only autoscaler"
    assert external_metric(kubectl, namespace, hpa) == 0.0  # idle

    svc = kubectl.get("service", name, namespace)
    assert svc is not None
    before = {p["metadata"]["name"] for p in scaling.serving_pods(kubectl, namespace, name)}
    load = Load(
        embedded.launcher.netns, svc["spec"]["clusterIP"], OPENAI_PORT,
        concurrency=scaling.LOAD_CONCURRENCY, max_requests=5_000, max_seconds=150,
        openai_model=doc["spec"]["model"]["name"],
    )  # fmt: skip
    start = time.monotonic()
    with load:
        ld = wait_for(
            "KEDA's HPA to scale the LLMDeployment up",
            lambda: kubectl.get("llmdeployment", name, namespace),
            lambda o: o is not None and o["spec"]["replicas"] > 1,
            timeout=TIMEOUT,
            interval=0.25,
        )
        asked = time.monotonic() - start
        assert ld is not None
        # What KEDA saw: the operator's query over the loaded pod, and its HPA's own decision.
        # The queue of the moment may be empty at a scrape (a cold run read 0 once, right after
        # KEDA's HPA read 8): the load shows in Prometheus within a few scrapes.
        prometheus = embedded.launcher.prometheus_url

        def queued() -> float:
            return float(sum(prometheus_query(prometheus, query).values()))

        in_prometheus = wait_for("the loaded pod's queue in Prometheus", queued, lambda v: v > 0, timeout=45)
        hpa = kubectl.get("hpa", f"keda-hpa-{name}", namespace)
        assert hpa is not None and hpa["status"]["desiredReplicas"] > 1, hpa
        print(
            f"keda: replicas -> {ld['spec']['replicas']} {asked:.1f} s after the load step; "
            f"{query} = {in_prometheus:g} in Prometheus; KEDA's HPA: {hpa['status'].get('currentMetrics')}"
        )
        wait_for(
            "a new serving pod created",
            lambda: {p["metadata"]["name"] for p in scaling.serving_pods(kubectl, namespace, name)} - before,
            timeout=60,
        )
    assert load.stats.failed == 0, load.stats.errors
    assert load.stats.ok > 0
    active = condition(kubectl.get("llmdeployment", name, namespace), "AutoscalingActive")
    assert active is not None and (active["status"], active["reason"]) == ("True", "ScaledObjectReady")
    assert "triton_pending_requests" in active["message"]
