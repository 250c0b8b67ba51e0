"""controller/rollout/analysis.py against a real HTTP server on 127.0.0.1 that answers what a hostile or
broken endpoint would: nothing of an answer's body reaches a Measurement, the status words made
of it or the logs, and a redirect is never followed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
import pytest_asyncio
from aiohttp import web
from llm_operator.api.v1alpha1 import AnalysisPhase, CanaryAnalysis
from llm_operator.controller.rollout import analysis
from llm_operator.rollout import analysis as verdicts
from llm_operator.rollout.types import Measurement

from e2e.cluster.processes import free_port

SECRET = "AKIA-SECRET-TOKEN-0123456789"
ANALYSIS = CanaryAnalysis.model_validate(
    {"prometheus": {"url": "http://unused"}, "maxErrorRatePercent": 1, "maxP99LatencyMilliseconds": 500}
)


def vector(*samples: object) -> dict[str, object]:
    return {"status": "success", "data": {"resultType": "vector", "result": list(samples)}}


def sample(value: object) -> dict[str, object]:
    return {"metric": {"leak": SECRET}, "value": [1.0, value]}


def error(kind: str) -> dict[str, str]:
    return {"status": "error", "errorType": kind, "error": SECRET}


def as_json(answer: object) -> bytes:
    return json.dumps(answer).encode()


JSON = "application/json"
# Path prefix -> (HTTP status, content type, body); each answers every query under it.
ANSWERS: dict[str, tuple[int, str, bytes]] = {
    "good": (200, JSON, as_json(vector(sample("12.5")))),
    "text": (200, "text/plain", f"aws_secret_access_key={SECRET}".encode()),
    "html": (200, "text/html", f"<html>{SECRET}</html>".encode()),
    "not-json": (200, JSON, f"{{{SECRET}".encode()),
    "wrong-shape": (200, JSON, as_json({"status": "success", "data": SECRET})),
    "matrix": (
        200,
        JSON,
        as_json({"status": "success", "data": {"resultType": "matrix", "result": [SECRET]}}),
    ),
    "not-a-dict": (200, JSON, as_json([SECRET])),
    "two-samples": (200, JSON, as_json(vector(sample("1"), sample("2")))),
    "bad-sample": (200, JSON, as_json(vector(sample(SECRET)))),
    "server-error": (500, "text/plain", SECRET.encode()),
    "server-error-json": (503, JSON, as_json(error("unavailable"))),
    "bad-data": (400, JSON, as_json(error("bad_data"))),
    "odd-error-type": (422, JSON, as_json(error(SECRET))),
    "refused-200": (200, JSON, as_json(error("execution"))),
    "huge": (200, JSON, as_json({"status": "success", "pad": SECRET * 50_000})),
    "deep": (200, JSON, b"[" * 200_000),
}
# Path prefix -> the words of its Measurements' error (fixed, whatever the body said).
SAYS = {
    "text": "Prometheus answered HTTP 200 with a body that is not JSON",
    "html": "Prometheus answered HTTP 200 with a body that is not JSON",
    "not-json": "Prometheus answered HTTP 200 with a body that is not JSON",
    "wrong-shape": "Prometheus answered a result that is not an instant vector",
    "matrix": "Prometheus answered a result that is not an instant vector",
    "not-a-dict": "Prometheus answered JSON that is not a query result",
    "two-samples": "expected one sample, Prometheus answered 2",
    "bad-sample": "Prometheus answered a sample that is not a number",
    "server-error": "Prometheus answered HTTP 500",
    "server-error-json": "Prometheus answered HTTP 503 (errorType unavailable)",
    "bad-data": "Prometheus answered HTTP 400 (errorType bad_data)",
    "odd-error-type": "Prometheus answered HTTP 422",
    "refused-200": "Prometheus refused the query (errorType execution)",
    "huge": "Prometheus answered more than 1 MiB",
    "deep": "Prometheus answered HTTP 200 with a body that is not JSON",
    "redirect": "Prometheus answered HTTP 302, a redirect, which is not followed",
    "slow": "Prometheus did not answer within 0.3 s",
}


class Server:
    def __init__(self) -> None:
        self.requests: list[str] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(request.path)
        prefix = request.path.split("/")[1]
        if prefix == "redirect":  # to an endpoint that would answer well
            raise web.HTTPFound("/good/api/v1/query?" + request.query_string)
        if prefix == "slow":
            await asyncio.sleep(5)
        status, content_type, body = ANSWERS[prefix]
        return web.Response(status=status, body=body, headers={"Content-Type": content_type})


@pytest_asyncio.fixture(loop_scope="function")
async def server() -> AsyncIterator[Server]:
    s = Server()
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", s.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    s.url = f"http://127.0.0.1:{port}"
    yield s
    await runner.cleanup()


async def measure(url: str) -> list[Measurement]:
    return await analysis.measure(url, ANALYSIS, "ns", "d", "r1")


async def test_a_good_answer_is_a_value(server: Server) -> None:
    found = await measure(f"{server.url}/good")
    assert [(m.value, m.requests, m.error) for m in found] == [(12.5, 12, None)] * 2


@pytest.mark.parametrize("prefix", sorted(SAYS))
async def test_no_answer_body_reaches_a_measurement_status_or_log(
    prefix: str, server: Server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(analysis, "TIMEOUT_SECONDS", 0.3)
    caplog.set_level(logging.DEBUG)
    found = await measure(f"{server.url}/{prefix}")
    assert [m.metric for m in found] == analysis.measured_metrics(ANALYSIS)
    for m in found:
        assert m.error == SAYS[prefix] and m.value is None and m.requests == 0, m
    # The words status and Events are made of: each window's, then the run's verdict.
    metrics = verdicts.fresh(ANALYSIS)
    for _ in range(ANALYSIS.consecutive_error_limit + 1):
        metrics, judged = verdicts.measure(metrics, found, ANALYSIS, datetime.now(UTC))
    phase, words = verdicts.verdict(metrics, ANALYSIS)
    assert phase == AnalysisPhase.ERROR and words is not None and SAYS[prefix] in words
    everything = [words, *(w for _, w in judged), *(ms.last_message or "" for ms in metrics), caplog.text]
    assert not [text for text in everything if SECRET in text]
    assert all(path.startswith(f"/{prefix}/") for path in server.requests), "a redirect was followed"


async def test_an_unreachable_prometheus_names_the_failure_kind_only() -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    found = await measure(closed)
    for m in found:
        assert m.error == f"cannot query Prometheus at {closed}: ClientConnectorError", m
