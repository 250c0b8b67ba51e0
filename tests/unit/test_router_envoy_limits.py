"""The router's limits and timeouts (render/router/limits.py) as the real Envoy 1.40 applies them:
what a client gets at each (docs/routing.md, "The router's limits"), with the limits shrunk so a
test reaches them. Runs the rendered configuration on 127.0.0.1 in FailOpen with no picker, so
requests go to a stand-in for the client Service (test_router_envoy.py has the setting up).

The sizes' derivation from the spec is pure and tested without Envoy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import socket
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator.api.v1alpha1 import FailureMode, LLMDeployment
from llm_operator.render.router.limits import RouterLimits, router_limits
from llm_operator.render.router.objects import limits_for, router_config

from tests.unit.test_router_envoy import (
    LIMITS,
    _local_config,
    _post,
    _running_envoy,
    needs_envoy,
    validate,
)


def _spec(**fields: Any) -> LLMDeployment:
    spec = {
        "model": {"name": "tiny-llama", "source": {"uri": "builtin://tiny-llama"}},
        "engine": {"backend": "cpu-reference"},
        "routing": {"mode": "inference-pool"},
    }
    for path, value in fields.items():
        *parents, leaf = path.split("__")
        node = spec
        for key in parents:
            node = node.setdefault(key, {})  # type: ignore[assignment]
        node[leaf] = value
    return LLMDeployment.model_validate({"metadata": {"name": "tiny", "namespace": "team"}, "spec": spec})


@pytest.mark.parametrize(
    ("fields", "requests"),
    [
        # cpu-reference queues without a bound: one more batch waiting per replica; one replica's
        # ceiling is 1; two revisions during a rollout.
        ({}, (64 + 64) * 1 * 2),
        # The example: 8 per batch, 3 replicas rounded up to 4.
        ({"engine__maxBatchSize": 8, "replicas": 3}, (8 + 8) * 4 * 2),
        # The engine's own queue bound where it has one: the spec's, else the profile's (balanced 1024).
        ({"runtime__batching__maxQueueSize": 100}, (64 + 100) * 2),
        ({"engine__backend": "tensorrt-engine", "model__source__uri": "hf://org/model",
          "model__cache__claimName": "models"}, (64 + 1024) * 2),
        ({"engine__backend": "tensorrt-engine", "model__source__uri": "hf://org/model",
          "model__cache__claimName": "models", "runtime__profile": "latency"}, (64 + 128) * 2),
        # The autoscaler's ceiling, not the replicas it has now (rounded: 5 -> 8).
        ({"replicas": 2, "autoscaling": {"maxReplicas": 5}}, (64 + 64) * 8 * 2),
    ],
)  # fmt: skip
def test_the_breakers_hold_what_the_pool_can(fields: dict[str, Any], requests: int) -> None:
    limits = router_limits(_spec(**fields).spec)
    assert (limits.requests, limits.connections) == (requests, 2 * requests)


def test_scaling_within_a_power_of_two_leaves_the_router_as_it_is() -> None:
    """The configuration is the router's ConfigMap: a change restarts the router and ends its
    streams, so kubectl scale 5 -> 8 must not change it, and 8 -> 9 does (the cap grows)."""
    lds = {n: _spec(replicas=n) for n in (5, 8, 9)}
    config = {n: router_config(ld, limits_for(ld))["data"]["envoy.yaml"] for n, ld in lds.items()}
    assert config[5] == config[8] != config[9]


@needs_envoy
def test_the_largest_deployment_s_limits_validate(tmp_path: Path) -> None:
    """Every limit at the API's maximum still fits Envoy's fields (uint32 circuit breakers)."""
    ld = _spec(replicas=1000, engine__maxBatchSize=4096, runtime__batching__maxQueueSize=1_000_000)
    rendered = router_config(ld, limits_for(ld))["data"]["envoy.yaml"]
    breakers = yaml.safe_load(rendered)["static_resources"]["clusters"][0]["circuit_breakers"]
    assert breakers["thresholds"][0]["max_requests"] == (4096 + 1_000_000) * 1024 * 2
    run = validate(rendered, tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr


class _Slow(http.server.BaseHTTPRequestHandler):
    """Answers every POST after its server's `delay` seconds, or once its `release` event is set:
    a generation that is silent until it ends (an unstreamed answer)."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        server: Any = self.server
        server.release.wait(server.delay)
        with contextlib.suppress(OSError):  # Envoy gave up on it first
            self.send_response(200)
            self.send_header("content-length", "4")
            self.end_headers()
            self.wfile.write(b"done")

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def slow() -> Iterator[Any]:
    server: Any = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    server.delay, server.release = 0.0, threading.Event()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.release.set()
    server.shutdown()
    server.server_close()


def _envoy_for(slow: Any, limits: RouterLimits) -> tuple[dict[str, Any], dict[str, int]]:
    return _local_config(FailureMode.FAIL_OPEN, int(slow.server_address[1]), limits=limits)


def _raw(port: int, data: bytes, wait: float) -> tuple[bytes, float]:
    """Sends `data` and reads until Envoy closes the connection: what came back, and after how long."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as connection:
        started = time.monotonic()
        connection.sendall(data)
        reply = b""
        while chunk := connection.recv(65536):
            reply += chunk
        return reply, time.monotonic() - started


@needs_envoy
def test_requests_beyond_the_breakers_get_503_at_once(slow: Any, tmp_path: Path) -> None:
    """The pool is full: requests beyond it are answered 503 by Envoy at once, not queued. Here
    the Service's HTTP/1.1 cluster (FailOpen, no picker), where `requests` connections carry
    requests and at most as many again wait for one (a request also waits while its connection
    opens, so a burst is refused sooner): of 3 x `requests` sent at once while the stand-in holds
    every answer, the refused come back within seconds, at most 2 x `requests` get through, and
    those are answered once the stand-in lets them go."""
    requests = 2
    config, ports = _envoy_for(slow, dataclasses.replace(LIMITS, requests=requests))
    slow.delay = 30
    url = f"http://127.0.0.1:{ports['listen']}/v1/completions"
    with _running_envoy(config, ports["ready"], tmp_path), futures.ThreadPoolExecutor(3 * requests) as pool:
        sent = [pool.submit(_post, url) for _ in range(3 * requests)]
        done, held = futures.wait(sent, timeout=5)
        slow.release.set()
        admitted = [f.result(timeout=10) for f in held]
    refused = [f.result() for f in done]
    assert refused and {status for status, _ in refused} == {503}, refused
    assert all(body.endswith("reset reason: overflow") for _, body in refused), refused
    assert 1 <= len(admitted) <= 2 * requests and set(admitted) == {(200, "done")}, admitted


@needs_envoy
def test_a_silent_answer_is_not_cut_before_the_silent_timeout(slow: Any, tmp_path: Path) -> None:
    """An unstreamed answer sends nothing until generation ends. The routes' own timeouts govern
    that silence, not the listener's stream idle timeout (Envoy's default 5 min, here 1 s to see
    it): a 3 s silence passes; with the routes' timeouts at 1 s it is ended with a 504."""
    slow.delay = 3
    for silent_timeout_s, expected in ((LIMITS.silent_timeout_s, (200, "done")), (1, 504)):
        config, ports = _envoy_for(slow, dataclasses.replace(LIMITS, silent_timeout_s=silent_timeout_s))
        for listener in config["static_resources"]["listeners"][1:]:
            listener["filter_chains"][0]["filters"][0]["typed_config"]["stream_idle_timeout"] = "1s"
        with _running_envoy(config, ports["ready"], tmp_path):
            answer = _post(f"http://127.0.0.1:{ports['listen']}/v1/completions")
        assert (answer if isinstance(expected, tuple) else answer[0]) == expected, answer


@needs_envoy
def test_slow_headers_and_slow_bodies_are_ended(slow: Any, tmp_path: Path) -> None:
    """Headers not complete within the headers timeout, or a body not complete within the request
    timeout: 408 and the connection closed, so a slow client holds nothing long."""
    limits = dataclasses.replace(LIMITS, headers_timeout_s=1, request_timeout_s=2)
    config, ports = _envoy_for(slow, limits)
    with _running_envoy(config, ports["ready"], tmp_path):
        headers, headers_after = _raw(ports["listen"], b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n", 10)
        body, body_after = _raw(
            ports["listen"],
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",
            10,
        )
    assert headers.startswith(b"HTTP/1.1 408") and 1 <= headers_after < 3, (headers, headers_after)
    assert body.startswith(b"HTTP/1.1 408") and 2 <= body_after < 4, (body, body_after)


@needs_envoy
def test_oversized_and_too_many_headers_get_431(slow: Any, tmp_path: Path) -> None:
    config, ports = _envoy_for(slow, LIMITS)
    url = f"http://127.0.0.1:{ports['listen']}/v1/completions"
    big = {"x-big": "a" * (LIMITS.max_headers_kb * 1024)}
    many = {f"x-h{i}": "1" for i in range(LIMITS.max_headers_count)}
    fits = {f"x-h{i}": "1" for i in range(LIMITS.max_headers_count - 10)}
    with _running_envoy(config, ports["ready"], tmp_path):
        answers = [_post(url, headers)[0] for headers in (big, many, fits)]
    assert answers == [431, 431, 200], answers
