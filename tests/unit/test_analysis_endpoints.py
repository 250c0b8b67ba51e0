"""Canary analysis queries only the operator's allowed Prometheus endpoints
(controller/rollout/prometheus_urls.py): the matching rules on the URLs that try to get around them, the
setting as the operator reads it, and the reconcile refusing a spec URL outside the list before
anything is queried (Stalled, a Warning Event, the URL never repeated, what serves kept)."""

from __future__ import annotations

import copy
import http.server
from collections.abc import Iterator
from typing import Any

import pytest
from llm_operator.api.v1alpha1 import CanaryAnalysis
from llm_operator.controller.config import OperatorConfig
from llm_operator.controller.rollout.prometheus_urls import (
    Endpoint,
    allowed,
    analysis_endpoint,
    parse,
    parse_list,
)
from llm_operator.plan.types import PlanningError

from e2e.cluster.testing import local_http_server
from tests.unit.fake_kube import FakeKube
from tests.unit.test_reconciler import condition, example, operator_with_nodes, reconcile, rolled_out

PROM = "http://prometheus.monitoring.svc:9090"
ALLOWED = parse_list(f"{PROM} https://thanos.example.com/prometheus/", "test")


@pytest.mark.parametrize(
    "url",
    [
        PROM, f"{PROM}/", f"{PROM}//", "HTTP://Prometheus.Monitoring.SVC:9090", "http://prometheus.monitoring.svc:09090",
        "https://thanos.example.com/prometheus", "https://thanos.example.com:443/prometheus/",
        "https://THANOS.example.com/prometheus",
    ],
)  # fmt: skip
def test_the_same_endpoint_written_another_way_matches(url: str) -> None:
    assert allowed(url, ALLOWED) in ALLOWED


@pytest.mark.parametrize(
    "url",
    [
        "http://prometheus.monitoring.svc:9091",  # another port
        "http://prometheus.monitoring.svc",  # port 80
        "https://prometheus.monitoring.svc:9090",  # another scheme
        "http://prometheus.monitoring.svc.:9090",  # a trailing dot: another name to resolve
        "http://prometheus.monitoring.svc.evil.com:9090",
        "http://prometheus.monitoring.svc:9090/api/v1/query",  # a path the list does not have
        "https://thanos.example.com",  # the list's host without its path
        "https://thanos.example.com/prometheus/../admin",
        "https://thanos.example.com/prometheusx",
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
        "http://127.0.0.1:9090",
    ],
)
def test_another_endpoint_does_not_match(url: str) -> None:
    assert allowed(url, ALLOWED) is None


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://prometheus.monitoring.svc:9090.evil.com", "has a port that is not a number"),
        ("http://prometheus.monitoring.svc:9090@evil.com", "has user information"),
        ("http://user:pw@prometheus.monitoring.svc:9090", "has user information"),
        ("http://prometheus.monitoring.svc:9090?x=", "has a query or a fragment"),
        ("http://prometheus.monitoring.svc:9090/?", "has a query or a fragment"),
        ("http://169.254.169.254/latest/meta-data/?x=", "has a query or a fragment"),
        ("http://prometheus.monitoring.svc:9090#", "has a query or a fragment"),
        ("http://prometheus.monitoring.svc:9090/%2e%2e/x", "percent-encoded"),
        ("http://prometheus.monitoring.svc:9090\\@evil.com", "backslash"),
        ("http://prometheus.monitoring.svc:9090\t", "whitespace"),
        ("http://prometheus.monitoring.svc:9090\n/x", "whitespace"),
        ("http://prometheus.monitoring.sv\u0441:9090", "non-ASCII"),  # a Cyrillic es for the c
        ("ftp://prometheus.monitoring.svc:9090", "is not an http:// or https:// URL"),
        ("http:///api", "has no host"),
        ("http://prometheus.monitoring.svc:0", "has a port that is not a number"),
        ("http://prometheus.monitoring.svc:99999", "has a port that is not a number"),
    ],
)
def test_urls_that_two_parsers_could_read_differently_are_refused(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why) as e:
        allowed(url, ALLOWED)
    assert "evil" not in str(e.value) and "169.254" not in str(e.value)


def test_what_is_queried_is_the_lists_own_url() -> None:
    spec = CanaryAnalysis.model_validate(
        {"prometheus": {"url": "http://Prometheus.Monitoring.SVC:9090/"}, "maxErrorRatePercent": 1}
    )
    assert analysis_endpoint(spec, ALLOWED) == PROM
    assert parse("http://[::1]:9090/p/").url == "http://[::1]:9090/p"


def test_the_setting_is_a_list_and_a_bad_entry_stops_the_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMOP_PROMETHEUS_URL", raising=False)
    monkeypatch.delenv("LLMOP_ANALYSIS_PROMETHEUS_URLS", raising=False)
    assert OperatorConfig.from_env().analysis_prometheus_urls == (parse(PROM),)
    monkeypatch.setenv("LLMOP_PROMETHEUS_URL", "http://other:9090")
    assert OperatorConfig.from_env().analysis_prometheus_urls == (Endpoint("http", "other", 9090, ""),)
    monkeypatch.setenv("LLMOP_ANALYSIS_PROMETHEUS_URLS", f" {PROM},http://a:1 \n http://b:2/x ")
    assert [e.url for e in OperatorConfig.from_env().analysis_prometheus_urls] == [
        PROM, "http://a:1", "http://b:2/x"
    ]  # fmt: skip
    monkeypatch.setenv("LLMOP_ANALYSIS_PROMETHEUS_URLS", "")
    assert OperatorConfig.from_env().analysis_prometheus_urls == ()
    monkeypatch.setenv("LLMOP_ANALYSIS_PROMETHEUS_URLS", f"{PROM} http://a:1/?token=x")
    with pytest.raises(ValueError, match="LLMOP_ANALYSIS_PROMETHEUS_URLS: entry 2 has a query or a fragment"):
        OperatorConfig.from_env()


class Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_GET(self) -> None:
        self.seen.append(self.path)
        self.send_response(500)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def listener() -> Iterator[str]:
    """A real endpoint on 127.0.0.1 that records every request it gets."""
    Recorder.seen = []
    with local_http_server(Recorder) as url:
        yield url


def with_analysis(body: dict[str, Any], url: str) -> dict[str, Any]:
    body = copy.deepcopy(body)
    body["spec"]["rollout"] = {"strategy": "canary", "canary": {
        "steps": [{"weight": 50, "pauseSeconds": 1}],
        "analysis": {"prometheus": {"url": url}, "intervalSeconds": 10, "maxErrorRatePercent": 1},
    }}  # fmt: skip
    return body


@pytest.mark.parametrize("suffix", ["", "/?x=", "/latest/meta-data/"])
async def test_a_spec_url_outside_the_list_stalls_the_deployment_and_is_never_queried(
    listener: str, suffix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LLMOP_ANALYSIS_PROMETHEUS_URLS", raising=False)
    monkeypatch.delenv("LLMOP_PROMETHEUS_URL", raising=False)
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(example("cpu-reference"))
    await reconcile(kube, reconciler, key)
    rolled_out(kube, "tiny-llama", 1)
    await reconcile(kube, reconciler, key)
    assert condition(kube, "tiny-llama", "Ready")["status"] == "True"
    kube.take_writes()

    url = listener + suffix
    spec = with_analysis(kube.objects[("LLMDeployment", *key)], url)["spec"]
    kube.edit("LLMDeployment", *key, spec=spec)
    await reconcile(kube, reconciler, key)

    stalled = condition(kube, "tiny-llama", "Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == "AnalysisEndpointNotAllowed"
    message = stalled["message"]
    assert message.startswith("spec.rollout.canary.analysis.prometheus.url ")
    assert f"not among the operator's allowed analysis endpoints ({PROM})" in message
    assert "operator.analysisPrometheusUrls" in message
    assert ("Warning", "AnalysisEndpointNotAllowed", message) in kube.events
    assert "127.0.0.1" not in str(kube.objects[("LLMDeployment", *key)]["status"])
    assert not [e for e in kube.events if "127.0.0.1" in e[2]]
    assert kube.take_writes() == [("status", "LLMDeployment", "tiny-llama")], "what serves is kept"
    assert Recorder.seen == []


async def test_the_same_spec_with_its_endpoint_allowed_is_not_stalled(
    listener: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMOP_ANALYSIS_PROMETHEUS_URLS", listener)
    kube, reconciler = await operator_with_nodes(FakeKube())
    key = kube.add_deployment(with_analysis(example("cpu-reference"), listener + "/"))
    await reconcile(kube, reconciler, key)
    assert condition(kube, "tiny-llama", "Stalled")["status"] == "False"
    assert ("StatefulSet", "default", "tiny-llama") in kube.objects


def test_an_empty_list_refuses_every_analysis() -> None:
    spec = CanaryAnalysis.model_validate({"prometheus": {"url": PROM}, "maxErrorRatePercent": 1})
    with pytest.raises(PlanningError, match=r"endpoints \(none are configured\)"):
        analysis_endpoint(spec, ())
