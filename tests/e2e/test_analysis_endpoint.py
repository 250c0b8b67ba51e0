"""The analysis URL on the real control plane (issue 26, item 1): the operator process, started as
`llm-operator run` with the test world's allowed endpoints, refuses an LLMDeployment whose
analysis URL names another endpoint (here a listener on 127.0.0.1 it could reach and read):
Stalled with reason AnalysisEndpointNotAllowed, a Warning Event, the URL never repeated, nothing
created and the listener never asked. Needs a cluster (the embedded one or KUBECONFIG's).
"""

from __future__ import annotations

import http.server
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.cluster import canary
from e2e.cluster.testing import Kubectl, condition, local_http_server, wait_for

pytestmark = pytest.mark.e2e


class Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_GET(self) -> None:
        self.seen.append(self.path)
        body = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def listener() -> Iterator[str]:
    Recorder.seen = []
    with local_http_server(Recorder) as url:
        yield url


def test_an_analysis_url_outside_the_allowed_endpoints_is_refused_and_never_queried(
    operator: None, kubectl: Kubectl, namespace: str, listener: str
) -> None:
    url = f"{listener}/latest/meta-data/?x="
    kubectl.apply(canary.deployment(url), namespace=namespace)

    def stalled() -> dict[str, Any] | None:
        return condition(kubectl.get("llmdeployment", canary.NAME, namespace), "Stalled")

    cond = wait_for("Stalled", stalled, lambda c: c is not None and c["status"] == "True", timeout=60)
    assert cond is not None and cond["reason"] == "AnalysisEndpointNotAllowed", cond
    assert cond["message"].startswith("spec.rollout.canary.analysis.prometheus.url has a query"), cond
    assert "operator.analysisPrometheusUrls" in cond["message"]
    events = wait_for(
        "the Warning Event",
        lambda: [
            e
            for e in kubectl.events(namespace, canary.NAME)
            if e.get("reason") == "AnalysisEndpointNotAllowed"
        ],
        bool,
        timeout=30,
    )
    assert events[0]["type"] == "Warning" and events[0]["message"] == cond["message"]
    status = kubectl.get("llmdeployment", canary.NAME, namespace)
    assert listener.removeprefix("http://") not in str(status.get("status") if status else None)
    assert kubectl.items("statefulsets", namespace) == [], "nothing is created for a refused spec"
    assert Recorder.seen == []
