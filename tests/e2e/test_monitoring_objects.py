"""The chart's monitoring objects against the real API server with the Prometheus Operator's own
CRDs (from its Go module, fetched through the module proxy into the cache, never into the repo):
the PodMonitor and the PrometheusRule are accepted field for field (server-side apply with strict
field validation), and so is the dashboard ConfigMap."""

from __future__ import annotations

import functools
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from e2e.cluster.testing import Kubectl, is_true, wait_for
from tests.unit.test_chart import CHART, HELM

pytestmark = pytest.mark.e2e

PROMETHEUS_OPERATOR_VERSION = "v0.85.0"
CRDS = ("podmonitors", "prometheusrules")


def prometheus_operator_crds() -> list[Path]:
    cache = Path(os.environ.get("LLMOP_CACHE") or Path.home() / ".cache" / "llm-operator")
    env = {**os.environ, "GOMODCACHE": str(cache / "gomod"), "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local"}
    module = f"github.com/prometheus-operator/prometheus-operator@{PROMETHEUS_OPERATOR_VERSION}"
    try:
        out = subprocess.run(["go", "mod", "download", "-json", module], env=env, cwd=cache,
                             capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    except (OSError, subprocess.SubprocessError) as e:
        pytest.fail(f"cannot fetch {module} through the Go module proxy: {e}", pytrace=False)
    base = Path(json.loads(out.stdout)["Dir"]) / "example" / "prometheus-operator-crd"
    return [base / f"monitoring.coreos.com_{name}.yaml" for name in CRDS]


@pytest.fixture
def prometheus_operator_api(kubectl: Kubectl) -> Iterator[None]:
    """PodMonitor and PrometheusRule CRDs for the test; removed after it unless they were there."""
    names = [f"{name}.monitoring.coreos.com" for name in CRDS]
    installed = [n for n in names if kubectl.get("crd", n) is None]
    for path in prometheus_operator_crds():
        kubectl.apply(yaml.safe_load(path.read_text()))
    for name in names:
        wait_for(f"CRD {name} Established", functools.partial(kubectl.get, "crd", name),
                 lambda c: is_true(c, "Established"))  # fmt: skip
    yield
    for name in installed:
        kubectl.delete("crd", name, wait=True)


def test_pod_monitor_rule_and_dashboard_are_accepted(
    kubectl: Kubectl, namespace: str, prometheus_operator_api: None
) -> None:
    assert HELM is not None, "helm not found: run `make tools`"
    values = {"monitoring": {
        "podMonitor": {"enabled": True, "labels": {"release": "kube-prometheus"}},
        "recordingRules": {"enabled": True, "rateWindow": "30s"},
        "dashboard": {"enabled": True},
    }}  # fmt: skip
    rendered = subprocess.run(
        [HELM, "template", "rel", str(CHART), "--namespace", namespace, "--show-only",
         "templates/monitoring.yaml", "-f", "-"],
        input=yaml.safe_dump(values), capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    assert sorted(d["kind"] for d in docs) == ["ConfigMap", "PodMonitor", "PodMonitor", "PrometheusRule"]
    # Strict field validation: a misspelt field is an error, not silently pruned.
    items = json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
    kubectl("apply", "--server-side", "--field-manager=e2e-tests", "--validate=strict", "-f", "-",
            input=items, namespace=namespace)  # fmt: skip
    monitor = kubectl.get("podmonitor", "rel-llm-operator-serving", namespace)
    assert monitor is not None
    assert monitor["spec"]["podTargetLabels"] == [
        "llmoperator.io/deployment", "llmoperator.io/pool", "llmoperator.io/revision", "llmoperator.io/role",
    ]  # fmt: skip
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    assert {r["targetLabel"] for r in endpoint["relabelings"]} == {"namespace", "pod"}
    router = kubectl.get("podmonitor", "rel-llm-operator-router", namespace)
    assert router is not None
    assert router["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "router"
    assert router["spec"]["podMetricsEndpoints"][0]["port"] == "picker-metrics"
    rule = kubectl.get("prometheusrule", "rel-llm-operator-autoscaling", namespace)
    assert rule is not None
    records = [r["record"] for r in rule["spec"]["groups"][0]["rules"]]
    assert records == [
        "triton_queue_compute_ratio", "triton_pending_requests", "triton_queue_time_microseconds",
        "trtllm_kv_cache_utilization",
    ]  # fmt: skip
    assert all("[30s]" in r["expr"] for r in rule["spec"]["groups"][0]["rules"] if "rate(" in r["expr"])
    dashboard = kubectl.get("configmap", "rel-llm-operator-dashboard", namespace)
    assert dashboard is not None and dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    json.loads(dashboard["data"]["llm-operator.json"])
