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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from llm_operator.api.v1alpha1 import AutoscalingMetric
from llm_operator.contract import OPENAI_PORT
from llm_operator.render.autoscaling import keda_query

from e2e.cluster import keda, scaling
from e2e.cluster.components import run_build_tools
from e2e.cluster.load import Load, prometheus_query
from e2e.cluster.state import StateDir
from e2e.cluster.testing import E2ECluster, Kubectl, condition, is_true, wait_for
from tests.e2e.test_operator import example, wait_ready

# Installs KEDA's CRDs and takes the cluster's external metrics API, both cluster-wide.
pytestmark = [pytest.mark.e2e, pytest.mark.exclusive]
TIMEOUT = 90
EXTERNAL_METRICS = "/apis/external.metrics.k8s.io/v1beta1"


def _tools(cluster: E2ECluster) -> dict[str, Path]:
    """KEDA's binaries (built here the first time, then cached) and the cluster's kubectl."""
    assert cluster.launcher is not None
    found = {k: Path(v) for k, v in StateDir(cluster.launcher.state_dir).meta()["tools"].items()}
    if not all(name in found for name in keda.BINARIES):
        found |= run_build_tools(print, groups=("core", "keda"))[0]
    return found


def _uninstall(kubectl: Kubectl, objects: list[dict[str, Any]]) -> None:
    """Every ScaledObject while KEDA still runs (it holds them with a finalizer, and so the CRD),
    the APIService (an aggregated API without its server breaks discovery), then KEDA's namespace
    and what it made outside it (RBAC, the CRDs)."""
    # check=False: an install that failed before its CRDs has none to delete.
    kubectl("delete", "scaledobjects", "--all", "--all-namespaces", "--timeout=60s", check=False)
    kubectl.delete("apiservice", keda.APISERVICE)
    kubectl("delete", "namespace", keda.NAMESPACE, "--ignore-not-found", "--wait=false")
    for obj in objects:
        kind, meta = obj["kind"], obj["metadata"]
        if meta.get("namespace") != keda.NAMESPACE and kind not in ("Namespace", "APIService"):
            kubectl.delete(kind, meta["name"], meta.get("namespace"), wait=kind == "CustomResourceDefinition")


@pytest.fixture(scope="module")
def keda_running(cluster: E2ECluster, kubectl: Kubectl) -> Iterator[None]:
    if cluster.launcher is None:
        pytest.skip("needs the embedded cluster's real node and monitoring stack")
    tools = _tools(cluster)
    start = time.monotonic()
    for name in keda.BINARIES:
        cluster.launcher.import_image(keda.archive(name, tools[name], print))
    objects = keda.manifests(tools["kubectl"], tools["keda-operator"])
    crds = [o for o in objects if o["kind"] == "CustomResourceDefinition"]
    try:
        kubectl.apply(crds)
        names = [c["metadata"]["name"] for c in crds]
        wait_for("KEDA's CRDs Established", lambda: [kubectl.get("crd", n) for n in names],
                 lambda found: all(is_true(c, "Established") for c in found))  # fmt: skip
        kubectl.apply([o for o in objects if o["kind"] != "CustomResourceDefinition"])
        wait_for("KEDA's Deployments Available",
                 lambda: [kubectl.get("deployment", d, keda.NAMESPACE) for d in keda.DEPLOYMENTS],
                 lambda found: all(is_true(d, "Available") for d in found), timeout=120)  # fmt: skip
        # KEDA's operator writes its CA into the APIService; then the aggregator reaches the adapter.
        wait_for(f"{keda.APISERVICE} Available", lambda: kubectl.get("apiservice", keda.APISERVICE),
                 lambda a: is_true(a, "Available"), timeout=TIMEOUT)  # fmt: skip
        print(f"keda: installed and serving external metrics in {time.monotonic() - start:.1f} s")
        yield
    finally:
        start = time.monotonic()
        _uninstall(kubectl, objects)
        print(f"keda: removed in {time.monotonic() - start:.1f} s")


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
        in_prometheus = sum(prometheus_query(embedded.launcher.prometheus_url, query).values())
        hpa = kubectl.get("hpa", f"keda-hpa-{name}", namespace)
        assert hpa is not None and hpa["status"]["desiredReplicas"] > 1, hpa
        print(
            f"keda: replicas -> {ld['spec']['replicas']} {asked:.1f} s after the load step; "
            f"{query} = {in_prometheus:g} in Prometheus; KEDA's HPA: {hpa['status'].get('currentMetrics')}"
        )
        assert in_prometheus > 0
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
