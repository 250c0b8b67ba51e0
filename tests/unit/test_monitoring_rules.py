"""The monitoring files the chart ships (charts/llm-operator/monitoring/): the recording rules
produce, per pod, every custom metric the operator's HPAs ask for, and prometheus-adapter serves
each of them as a pod metric."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator import labels as L
from llm_operator.render.autoscaling import DEPLOYMENT_SERIES_LABEL, METRIC_NAMES
from llm_operator.render.router.objects import router_pod_labels

from tests.unit.test_chart import needs_helm, one, render

MONITORING = Path(__file__).resolve().parents[2] / "charts" / "llm-operator" / "monitoring"


def load(name: str) -> Any:
    return yaml.safe_load((MONITORING / name).read_text())


def recording_rules() -> dict[str, str]:
    rules = [r for g in load("recording-rules.yaml")["groups"] for r in g["rules"]]
    recorded = [r["record"] for r in rules]
    assert len(recorded) == len(set(recorded)), recorded
    return {r["record"]: r["expr"] for r in rules}


def test_one_recording_rule_per_autoscaling_metric() -> None:
    assert set(recording_rules()) == set(METRIC_NAMES.values())


def test_every_aggregation_keeps_namespace_and_pod() -> None:
    for name, expr in recording_rules().items():
        groupings = re.findall(r"\b(?:sum|max|min|avg)\s+by\s*\(([^)]*)\)", expr)
        assert groupings, f"{name}: not aggregated per pod"
        for labels in groupings:
            assert {"namespace", "pod"} <= {x.strip() for x in labels.split(",")}, (name, labels)


def test_rate_windows_span_four_scrapes_of_15s() -> None:
    for name, expr in recording_rules().items():
        for window in re.findall(r"\[(\w+)\]", expr):
            assert window == "1m", (name, window)


def test_adapter_serves_every_recorded_series_as_a_pod_metric() -> None:
    served = {}
    for rule in load("adapter-rules.yaml")["rules"]:
        series = re.fullmatch(r"(\w+)\{.*\}", rule["seriesQuery"])
        assert series, rule["seriesQuery"]
        assert rule["resources"]["overrides"] == {
            "namespace": {"resource": "namespace"},
            "pod": {"resource": "pod"},
        }
        assert re.fullmatch(rule["name"]["matches"], series.group(1))
        assert "<<.GroupBy>>" in rule["metricsQuery"] and "<<.LabelMatchers>>" in rule["metricsQuery"]
        served[rule["name"]["as"]] = series.group(1)
    assert served == {m: m for m in METRIC_NAMES.values()}


def test_prometheus_adapter_chart_values_carry_the_same_rules() -> None:
    values = load("prometheus-adapter-values.yaml")
    assert values["rules"] == {"default": False, "custom": load("adapter-rules.yaml")["rules"]}


# --- promtool: the rules parse, and compute what they promise on real series ---------------------


def find_promtool() -> str | None:
    """promtool that `make tools` builds into the cache with Prometheus (e2e/cluster/build-tools.sh)."""
    cache = Path(os.environ.get("LLMOP_CACHE") or Path.home() / ".cache" / "llm-operator")
    found = sorted(cache.glob("bin/prometheus-*/promtool"), reverse=True)
    return str(found[0]) if found else None


PROMTOOL = find_promtool()
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not built: run `make tools`")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60, check=False)


@needs_promtool
def test_promtool_checks_the_rules() -> None:
    result = promtool("check", "rules", str(MONITORING / "recording-rules.yaml"))
    assert result.returncode == 0 and "SUCCESS: 4 rules found" in result.stdout, result.stdout + result.stderr


def series(name: str, pod: str, values: str, **labels: str) -> dict[str, str]:
    all_labels = {"namespace": "ns", "pod": pod, "llmoperator_io_deployment": "d", "version": "1", **labels}
    return {
        "series": name + "{" + ",".join(f'{k}="{v}"' for k, v in all_labels.items()) + "}",
        "values": values,
    }


def sample(name: str, pod: str, value: float) -> dict[str, Any]:
    return {"labels": f'{name}{{llmoperator_io_deployment="d",namespace="ns",pod="{pod}"}}', "value": value}


@needs_promtool
def test_recorded_values_per_pod_over_several_models(tmp_path: Path) -> None:
    """Pod p0 serves two models under load, p1 is idle: one value per pod, summed over models,
    never NaN when idle (the HPA would read NaN as a metric error)."""
    every_15s = "0+{}x40"
    kv, req = "nv_trt_llm_kv_cache_block_metrics", "nv_trt_llm_request_metrics"
    inputs = [
        # p0: each model queues 10 ms and computes 5 ms per second; the ensemble completes 1
        # request/s, tensorrt_llm 2/s.
        *(series("nv_inference_queue_duration_us", "p0", every_15s.format(150000), model=m)
          for m in ("ensemble", "tensorrt_llm")),
        *(series("nv_inference_compute_infer_duration_us", "p0", every_15s.format(75000), model=m)
          for m in ("ensemble", "tensorrt_llm")),
        series("nv_inference_request_success", "p0", every_15s.format(15), model="ensemble"),
        series("nv_inference_request_success", "p0", every_15s.format(30), model="tensorrt_llm"),
        series("nv_inference_pending_request_count", "p0", "3x40", model="ensemble"),
        series("nv_inference_pending_request_count", "p0", "0x40", model="tensorrt_llm"),
        series(req, "p0", "5x40", model="tensorrt_llm", request_type="waiting"),
        series(req, "p0", "7x40", model="tensorrt_llm", request_type="active"),
        series(kv, "p0", "30x40", model="tensorrt_llm", kv_cache_block_type="used"),
        series(kv, "p0", "90x40", model="tensorrt_llm", kv_cache_block_type="free"),
        series(kv, "p0", "120x40", model="tensorrt_llm", kv_cache_block_type="max"),
        # p1: up, idle
        *(series(n, "p1", "0+0x40", model="ensemble") for n in ("nv_inference_queue_duration_us",
          "nv_inference_compute_infer_duration_us", "nv_inference_request_success")),
        series("nv_inference_pending_request_count", "p1", "0x40", model="ensemble"),
        series(req, "p1", "0x40", model="ensemble", request_type="waiting"),
        series(kv, "p1", "0x40", model="ensemble", kv_cache_block_type="used"),
        series(kv, "p1", "64x40", model="ensemble", kv_cache_block_type="max"),
    ]  # fmt: skip
    expected = {
        "triton_queue_compute_ratio": (2.0, 0.0),  # 20 ms queued / 10 ms computed per second
        "triton_pending_requests": (8.0, 0.0),  # Triton's 3 + TensorRT-LLM's 5 waiting, not the active
        "triton_queue_time_microseconds": (10000.0, 0.0),  # the ensemble's 10 ms per request
        "trtllm_kv_cache_utilization": (0.25, 0.0),
    }
    tests = {
        "rule_files": [str(MONITORING / "recording-rules.yaml")],
        "evaluation_interval": "15s",
        "tests": [{
            "interval": "15s",
            "input_series": inputs,
            "promql_expr_test": [
                {"expr": n, "eval_time": "5m", "exp_samples": [sample(n, "p0", p0), sample(n, "p1", p1)]}
                for n, (p0, p1) in expected.items()
            ],
        }],
    }  # fmt: skip
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    result = promtool("test", "rules", str(tmp_path / "tests.yaml"))
    assert result.returncode == 0, result.stdout + result.stderr


# --- the chart's objects embed these files --------------------------------------------------------


@needs_helm
def test_monitoring_objects_are_off_by_default() -> None:
    kinds = {d["kind"] for d in render()}
    assert not {"PodMonitor", "PrometheusRule"} & kinds
    assert not [
        d for d in render() if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"]["labels"]
    ]


@needs_helm
def test_pod_monitor_scrapes_leaders_with_the_labels_the_rules_need() -> None:
    monitors = {d["metadata"]["name"]: d for d in render("namespaces") if d["kind"] == "PodMonitor"}
    assert set(monitors) == {"rel-llm-operator-serving", "rel-llm-operator-router"}, set(monitors)
    monitor = monitors["rel-llm-operator-serving"]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
    spec = monitor["spec"]
    assert spec["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    assert spec["selector"]["matchLabels"] == {L.MANAGED_BY: "llm-operator", L.ROLE: "leader"}
    assert set(spec["podTargetLabels"]) == {L.DEPLOYMENT, L.POOL, L.REVISION, L.ROLE}
    (endpoint,) = spec["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["interval"]) == ("metrics", "/metrics", "5s")
    targets = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
    assert targets == {"namespace": ["__meta_kubernetes_namespace"], "pod": ["__meta_kubernetes_pod_name"]}
    # prometheus-operator sanitizes the pod label into the name the rules and KEDA's query use.
    assert re.sub(r"[^a-zA-Z0-9_]", "_", L.DEPLOYMENT) == DEPLOYMENT_SERIES_LABEL
    # The routers' pickers (KEDA's wake trigger at minReplicas 0), with the same namespace label.
    router = monitors["rel-llm-operator-router"]["spec"]
    assert router["namespaceSelector"] == spec["namespaceSelector"]
    labels = router_pod_labels("any")
    assert router["selector"]["matchLabels"] == {k: labels[k] for k in (L.NAME, L.COMPONENT)}
    (endpoint,) = router["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["interval"]) == ("picker-metrics", "5s")
    assert {r["targetLabel"] for r in endpoint["relabelings"]} == {"namespace", "pod"}


@needs_helm
@needs_promtool
def test_prometheus_rule_embeds_the_rules_with_the_configured_window(tmp_path: Path) -> None:
    rule = one(render("namespaces"), "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
    (group,) = rule["spec"]["groups"]
    assert group["interval"] == "5s"
    assert {r["record"]: r["expr"] for r in group["rules"]} == {
        name: expr.replace("[1m]", "[20s]") for name, expr in recording_rules().items()
    }
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"]))
    result = promtool("check", "rules", str(tmp_path / "rules.yaml"))
    assert result.returncode == 0, result.stdout + result.stderr


# What the dashboard may query: the recorded series, what serving pods export (Triton's TTFT
# histogram from 24.11, TensorRT-LLM's token histogram: tests/triton/test_load_metrics.py), the
# scrape's own `up`, and kube-state-metrics' HPA replicas.
DASHBOARD_METRICS = {
    *METRIC_NAMES.values(),
    "nv_inference_first_response_histogram_ms_bucket",
    "nv_llm_output_token_len_sum",
    "up",
    "kube_horizontalpodautoscaler_status_desired_replicas",
}


@needs_helm
@needs_promtool
def test_dashboard_is_valid_json_querying_only_recorded_or_exported_series(tmp_path: Path) -> None:
    (cm,) = [
        d
        for d in render("namespaces")
        if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"]["labels"]
    ]
    assert cm["metadata"]["namespace"] == "grafana"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1" and cm["metadata"]["labels"]["team"] == "ml"
    dashboard = json.loads(cm["data"]["llm-operator.json"])
    assert dashboard == json.loads((MONITORING / "dashboard.json").read_text())
    titles = {p["title"] for p in dashboard["panels"]}
    for shown in (
        "Queue time",
        "Time to first token",
        "tokens per second",
        "KV-cache",
        "Pending",
        "Replicas",
    ):
        assert any(shown.lower() in t.lower() for t in titles), shown
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"([a-zA-Z_:][\w:]*)\{", e)}
    assert used <= DASHBOARD_METRICS, used - DASHBOARD_METRICS
    assert set(METRIC_NAMES.values()) <= used
    # Grafana's variables filled in, every query parses (as a rule expression) with promtool.
    filled = [e.replace("$__rate_interval", "1m").replace("$namespace", "ns").replace("$deployment", "d")
              for e in exprs]  # fmt: skip
    groups = [{"name": "dashboard", "rules": [{"record": f"q{i}", "expr": e} for i, e in enumerate(filled)]}]
    (tmp_path / "queries.yaml").write_text(yaml.safe_dump({"groups": groups}))
    result = promtool("check", "rules", str(tmp_path / "queries.yaml"))
    assert result.returncode == 0, result.stdout + result.stderr
