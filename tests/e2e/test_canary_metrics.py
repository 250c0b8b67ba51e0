"""Canary analysis measurements on real pods: two cpu-reference LLMDeployments under the same
bounded load, one of them with the CPU runtime's TEST-ONLY fault knob on (spec.runtime.env), are
scraped by the test world's Prometheus; controller/rollout/analysis.measure() reads each revision's window
and sees the faulty one fail its error-rate and TTFT budgets while the good one stays within them.
A Prometheus that cannot be reached, or a server that is not Prometheus, gives errors, never values.

Needs the embedded cluster (its monitoring stack and the real node).
"""

from __future__ import annotations

import asyncio
import http.server
import time
from collections.abc import Iterator
from typing import Any

import pytest
from llm_operator.api.v1alpha1 import CanaryAnalysis
from llm_operator.contract import OPENAI_PORT
from llm_operator.controller.rollout.analysis import measure, measured_metrics
from llm_operator.rollout import queries
from llm_operator.rollout.types import Measurement

from e2e.cluster.load import Load, prometheus_query
from e2e.cluster.processes import free_port
from e2e.cluster.testing import E2ECluster, Kubectl, local_http_server, wait_for
from tests.e2e.test_operator import example, wait_ready

pytestmark = pytest.mark.e2e
BUDGET_MS = 1000
LOAD_S = 20
# The window ends when it is measured: long enough to hold the whole load while the test waits for
# the last scrape, so it never slides past the load's start.
WINDOW_S = LOAD_S + 40
FAULTS = [
    {"name": "LLMOP_FAULT_ERROR_PERCENT", "value": "20"},
    {"name": "LLMOP_FAULT_TTFT_MS", "value": "1500"},
]


def analysis(url: str) -> CanaryAnalysis:
    doc = {
        "prometheus": {"url": url}, "intervalSeconds": WINDOW_S, "maxErrorRatePercent": 1,
        "maxP99LatencyMilliseconds": 5000, "maxTimeToFirstTokenMilliseconds": BUDGET_MS,
        "maxMeanQueueTimeMilliseconds": 5000,
    }  # fmt: skip
    return CanaryAnalysis.model_validate(doc)


def deployment(name: str, env: list[dict[str, str]]) -> dict[str, Any]:
    doc = example("cpu-reference.yaml")
    doc["metadata"]["name"] = name
    doc["spec"]["runtime"]["env"] = env
    # The budget reaches the model repository (a bucket edge at it); strategy stays rolling.
    doc["spec"]["rollout"] = {"canary": {"steps": [{"weight": 10}], "analysis": {
        "prometheus": {"url": "http://prometheus.monitoring.svc:9090"},
        "maxTimeToFirstTokenMilliseconds": BUDGET_MS}}}  # fmt: skip
    return doc


def revision(kubectl: Kubectl, namespace: str, name: str) -> str:
    (pod,) = kubectl.items("pods", namespace, f"llmoperator.io/deployment={name},llmoperator.io/role=leader")
    return str(pod["metadata"]["labels"]["llmoperator.io/revision"])


def cluster_ip(kubectl: Kubectl, namespace: str, name: str) -> str:
    service = kubectl.get("service", name, namespace)
    assert service is not None
    return str(service["spec"]["clusterIP"])


def by_metric(measurements: list[Measurement]) -> dict[str, Measurement]:
    return {m.metric: m for m in measurements}


def test_faulty_revision_fails_its_budgets_and_the_good_one_passes(
    operator: None, embedded: E2ECluster, kubectl: Kubectl, namespace: str
) -> None:
    assert embedded.launcher is not None
    prometheus = embedded.launcher.prometheus_url
    kubectl.apply([deployment("good", []), deployment("faulty", FAULTS)], namespace=namespace)
    for name in ("good", "faulty"):
        wait_ready(kubectl, namespace, name, timeout=240)
    revisions = {name: revision(kubectl, namespace, name) for name in ("good", "faulty")}
    # increase() counts from a pod's first scrape: the load starts once both pods are scraped.
    counters = [
        "nv_inference_request_success" + queries.selector(queries.Target(namespace, name, rev, WINDOW_S))
        for name, rev in revisions.items()
    ]
    scraped = lambda: all(prometheus_query(prometheus, c) for c in counters)  # noqa: E731
    wait_for("both pods' first scrape", scraped, bool, timeout=60)
    loads = [
        Load(embedded.launcher.netns, cluster_ip(kubectl, namespace, name), OPENAI_PORT, concurrency=2,
             max_requests=400, max_seconds=LOAD_S, openai_model="tiny-llama",
             body={"model": "tiny-llama", "prompt": "Once upon a time", "max_tokens": 8})
        for name in ("good", "faulty")
    ]  # fmt: skip
    for load in loads:
        load.__enter__()
    try:
        time.sleep(LOAD_S)
    finally:
        stats = [load.stop() for load in loads]
    assert stats[0].failed == 0 and stats[0].ok > 20, stats[0]
    assert stats[1].failed > 0 and stats[1].ok > 0, stats[1]

    def window(name: str) -> dict[str, Measurement]:
        return by_metric(
            asyncio.run(measure(prometheus, analysis(prometheus), namespace, name, revisions[name]))
        )

    # The last scrape (every 2 s) has the load's end once the counters stop moving.
    good = wait_for(
        "the good revision's window in Prometheus",
        lambda: window("good"),
        lambda m: m[queries.ERROR_RATE].requests >= stats[0].ok * 0.7,
        timeout=20,
    )
    faulty = window("faulty")
    print({"good": good, "faulty": faulty, "load": stats})
    assert set(good) == set(faulty) == set(measured_metrics(analysis(prometheus)))
    for m in (*good.values(), *faulty.values()):
        assert m.error is None and m.value is not None, m
    values = {name: {m.metric: m.value or 0.0 for m in ms.values()} for name, ms in (("good", good),
              ("faulty", faulty))}  # fmt: skip
    assert values["good"][queries.ERROR_RATE] == 0
    assert 0 < values["good"][queries.TIME_TO_FIRST_TOKEN] <= BUDGET_MS
    # Every 5th request of each of the pod's two model instances fails (and its batch with it):
    # 20 % of 25 requests seen in the first run, at least 10 % of any 10. The budget is 1 %.
    assert values["faulty"][queries.ERROR_RATE] >= 10
    assert values["faulty"][queries.TIME_TO_FIRST_TOKEN] > BUDGET_MS
    assert faulty[queries.ERROR_RATE].requests >= (stats[1].ok + stats[1].failed) * 0.7


class NotPrometheus(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"<html>login</html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def not_prometheus() -> Iterator[str]:
    with local_http_server(NotPrometheus) as url:
        yield url


def test_unreachable_or_wrong_prometheus_is_an_error_never_a_value(not_prometheus: str) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    not_json = "Prometheus answered HTTP 200 with a body that is not JSON"
    for url, says in ((closed, f"cannot query Prometheus at {closed}: "), (not_prometheus, not_json)):
        found = asyncio.run(measure(url, analysis(url), "ns", "d", "r"))
        assert [m.metric for m in found] == measured_metrics(analysis(url))
        for m in found:
            assert m.value is None and m.requests == 0 and m.error is not None and says in m.error, m
            assert "login" not in m.error, "an answer's body is never repeated"
