"""The test world's monitoring configuration (e2e/cluster/monitoring.py), pure parts: the chart's
recording rules at test speed, and what Prometheus may scrape."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from e2e.cluster import monitoring


def test_recording_rules_are_the_charts_with_test_speed_windows() -> None:
    source = monitoring.RECORDING_RULES.read_text()
    scaled = yaml.safe_load(monitoring.recording_rules(source))
    original = yaml.safe_load(source)
    assert [r["record"] for g in scaled["groups"] for r in g["rules"]] == [
        r["record"] for g in original["groups"] for r in g["rules"]
    ]
    assert {g["interval"] for g in scaled["groups"]} == {f"{monitoring.SCRAPE_INTERVAL_S}s"}
    exprs = " ".join(r["expr"] for g in scaled["groups"] for r in g["rules"])
    assert "[1m]" not in exprs
    windows = set(re.findall(r"\[(\w+)\]", exprs))
    assert windows == {f"{monitoring.RATE_WINDOW_S}s"}
    assert monitoring.RATE_WINDOW_S >= 4 * monitoring.SCRAPE_INTERVAL_S


def _relabel(config: dict[str, object], meta: dict[str, str]) -> dict[str, str] | None:
    """Apply the keep/drop/replace relabel steps used here as Prometheus does (fully anchored)."""
    labels = dict(meta)
    job = config["scrape_configs"][0]  # type: ignore[index]
    for step in job["relabel_configs"]:
        value = ";".join(labels.get(s, "") for s in step.get("source_labels", []))
        matched = re.fullmatch(step.get("regex", "(.*)"), value) is not None
        action = step.get("action", "replace")
        if action == "keep" and not matched:
            return None
        if action == "drop" and matched:
            return None
        if action == "replace" and matched:
            labels[step["target_label"]] = step.get("replacement", value)
    return {k: v for k, v in labels.items() if not k.startswith("__meta_")}


def serving_pod(ip: str, port_name: str = "metrics") -> dict[str, str]:
    return {
        "__meta_kubernetes_pod_ip": ip,
        "__meta_kubernetes_pod_container_port_name": port_name,
        "__meta_kubernetes_pod_phase": "Running",
        "__meta_kubernetes_namespace": "team-a",
        "__meta_kubernetes_pod_name": "tiny-llama-0",
        "__meta_kubernetes_pod_container_name": "triton",
        "__meta_kubernetes_pod_label_llmoperator_io_deployment": "tiny-llama",
        "__meta_kubernetes_pod_label_llmoperator_io_revision": "abc123",
        "__meta_kubernetes_pod_label_llmoperator_io_role": "leader",
    }


def test_only_metrics_ports_of_real_node_pods_are_scraped() -> None:
    config = monitoring.prometheus_config(Path("/k"), Path("/r"))
    # KWOK's fake pod addresses (elsewhere in the cluster CIDR) are never dialled.
    assert _relabel(config, serving_pod("10.244.0.7")) is None
    assert _relabel(config, serving_pod("10.244.1.7")) is None
    assert _relabel(config, serving_pod("10.244.100.7", "http")) is None
    target = _relabel(config, serving_pod("10.244.100.77"))
    assert target is not None
    assert {k: target[k] for k in ("namespace", "pod", "container", "job")} == {
        "namespace": "team-a",
        "pod": "tiny-llama-0",
        "container": "triton",
        "job": "monitoring/llm-operator-serving",
    }
    assert target["llmoperator_io_deployment"] == "tiny-llama"
    assert target["llmoperator_io_revision"] == "abc123"
    assert target["llmoperator_io_role"] == "leader"
    sd = config["scrape_configs"][0]["kubernetes_sd_configs"][0]
    assert sd["selectors"] == [
        {
            "role": "pod",
            "label": "llmoperator.io/deployment,llmoperator.io/role=leader",
            "field": "spec.nodeName=real-0",
        }
    ]


def test_custom_metrics_apiservices_check_the_adapters_cert() -> None:
    services = monitoring.apiservices(b"PEM")
    assert [s["metadata"]["name"] for s in services] == [
        "v1beta1.custom.metrics.k8s.io",
        "v1beta2.custom.metrics.k8s.io",
    ]
    for s in services:
        assert s["spec"]["caBundle"] == "UEVN" and "insecureSkipTLSVerify" not in s["spec"]
        assert s["spec"]["service"] == {"name": "prometheus-adapter", "namespace": "monitoring", "port": 443}
