"""The monitoring files the chart ships (charts/llm-operator/monitoring/): the recording rules
produce, per pod, every custom metric the operator's HPAs ask for, and prometheus-adapter serves
each of them as a pod metric."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from llm_operator.render.autoscaling import METRIC_NAMES

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
