"""The router's Envoy while the picker holds requests (autoscaling.minReplicas 0; render/router/hold.py),
run by the real Envoy 1.40 with the rendered configuration on 127.0.0.1.

A stand-in for the picker's ext_proc service (TLS with the deployment's certificate, as the picker
serves it) holds each request, then ends it as the picker's flow control does
(GIE v1.5.0 pkg/common/error/error.go BuildErrResponse: an ImmediateResponse with status 503 past
the hold or 429 with the queue full, and a plain-text body): the client gets OpenAI's error object,
with Retry-After, after the whole hold. The first hold is longer than ext_proc's gRPC timeout
(10 s): it does not cut a held stream.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from llm_operator.api.v1alpha1 import FailureMode, LLMDeployment
from llm_operator.images import Images
from llm_operator.render.router.limits import RouterLimits
from llm_operator.render.router.objects import limits_for, router_config, router_deployment, router_service
from llm_operator.render.scale_to_zero import RETRY_AFTER_SECONDS

from tests.unit.test_router_envoy import (
    _health_server,
    _local_config,
    _picker_tls,
    _running_envoy,
    needs_envoy,
    validate,
)
from tests.unit.waker_fixtures import dechunk, exchange, request_bytes, waker_on

HOLD_S = 11  # past ext_proc's 10 s gRPC timeout (render/router/envoy.py)
PICKER_SAYS = {
    503: "inference error: ServiceUnavailable - request timed out in queue: request evicted: TTL expired",
    429: "inference error: ResourceExhausted - request rejected: queue at capacity",
}


def zero_deployment(min_replicas: int = 0) -> LLMDeployment:
    autoscaling: dict[str, Any] = {"provider": "keda", "minReplicas": min_replicas, "maxReplicas": 2}
    if min_replicas == 0:
        autoscaling["scaleToZero"] = {"holdSeconds": HOLD_S, "maxHeldRequests": 20}
    return LLMDeployment.model_validate(
        {
            "metadata": {"name": "tiny", "namespace": "team"},
            "spec": {
                "model": {"name": "tiny-llama", "source": {"uri": "builtin://tiny-llama"}},
                "engine": {"backend": "cpu-reference"},
                "routing": {"mode": "inference-pool"},
                "autoscaling": autoscaling,
            },
        }
    )


def limits_at_zero() -> RouterLimits:
    """The limits zero_deployment()'s router is rendered with: its hold is the spec's."""
    return limits_for(zero_deployment())


def _varint(n: int) -> bytes:
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return out


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def immediate_response(status: int, body: str) -> bytes:
    """ProcessingResponse{immediate_response: {status: {code}, body}} in protobuf's wire format
    (envoyproxy/envoy api/envoy/service/ext_proc/v3/external_processor.proto: field 7; ImmediateResponse
    status 1, body 3; envoy.type.v3.HttpStatus code 1)."""
    http_status = _varint(1 << 3) + _varint(status)
    return _field(7, _field(1, http_status) + _field(3, body.encode()))


class _HoldingPicker:
    """ext_proc over TLS: takes a request's first message, holds it, then ends it as `answers` says
    (status per request, in arrival order)."""

    def __init__(self, port: int, files: Path, hold_s: float, answers: list[int]) -> None:
        self.hold_s, self.answers, self.lock = hold_s, answers, threading.Lock()
        process = grpc.stream_stream_rpc_method_handler(
            self.process, request_deserializer=bytes, response_serializer=bytes
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "envoy.service.ext_proc.v3.ExternalProcessor", {"Process": process}
                ),
            )
        )
        chain = [((files / "tls.key").read_bytes(), (files / "tls.crt").read_bytes())]
        self.server.add_secure_port(f"127.0.0.1:{port}", grpc.ssl_server_credentials(chain))
        self.server.start()

    def process(self, messages: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        next(messages)  # the request's headers
        with self.lock:
            status = self.answers.pop(0) if self.answers else 429
        time.sleep(self.hold_s if status == 503 else 0)
        yield immediate_response(status, PICKER_SAYS[status])


def _post(url: str) -> tuple[int, dict[str, str], str]:
    body = b'{"model": "tiny-llama", "prompt": "hi", "max_tokens": 1}'
    request = urllib.request.Request(url, body, {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=HOLD_S + 30) as response:
            return response.status, _lower(response.headers), response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, _lower(e.headers), e.read().decode()


def _lower(headers: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


@needs_envoy
@pytest.mark.parametrize("mode", list(FailureMode))
def test_the_picker_refusals_reach_the_client_as_openai_errors_after_the_hold(
    mode: FailureMode, tmp_path: Path
) -> None:
    limits = limits_at_zero()
    assert limits.hold_s == HOLD_S
    config, ports = _local_config(mode, 1, limits=limits)  # no request may reach the Service
    url = f"http://127.0.0.1:{ports['listen']}/v1/completions"
    health = _health_server(ports["health"])
    picker = _HoldingPicker(ports["picker"], _picker_tls(), HOLD_S, [])
    try:
        with _running_envoy(config, ports["ready"], tmp_path):
            started = time.monotonic()
            # Until Envoy sees the picker healthy, it answers itself (FailClose) or tries the Service.
            while (refused := _post(url))[0] != 429:
                assert time.monotonic() - started < 10, refused
                time.sleep(0.2)
            picker.answers.append(503)
            started = time.monotonic()
            answer = _post(url)
            held = time.monotonic() - started
    finally:
        picker.server.stop(None).wait()
        health.stop(None).wait()
    assert held >= HOLD_S, f"answered after {held:.1f} s, before the hold"
    for (status, headers, body), (kind, code, words) in (
        (answer, ("server_error", "model_not_ready", f"within the router's hold of {HOLD_S} s")),
        (refused, ("requests", "rate_limit_exceeded", "autoscaling.scaleToZero.maxHeldRequests")),
    ):
        assert headers.get("retry-after") == str(RETRY_AFTER_SECONDS), headers
        assert headers.get("content-type") == "application/json", headers
        error = json.loads(body)["error"]
        assert (error["type"], error["param"], error["code"]) == (kind, None, code), error
        assert words in error["message"] and PICKER_SAYS[status] in error["message"], error


@needs_envoy
def test_behind_the_waker_a_held_stream_gets_comments_then_the_refusal_as_an_sse_event(
    tmp_path: Path,
) -> None:
    """Envoy's OpenAI listener on 127.0.0.1 (client_bind, as rendered at zero) behind the waker: a
    streamed completion held 4 s gets comments from 1 s on, every second, then the hold's 503, made
    OpenAI's error object by Envoy, as one data event and [DONE]."""
    limits = limits_at_zero()
    config, ports = _local_config(FailureMode.FAIL_CLOSE, 1, limits=limits)
    url = f"http://127.0.0.1:{ports['listen']}/v1/completions"
    health = _health_server(ports["health"])
    picker = _HoldingPicker(ports["picker"], _picker_tls(), 4, [])
    streamed = {"model": "tiny-llama", "prompt": "hi", "max_tokens": 1, "stream": True}
    try:
        with (
            _running_envoy(config, ports["ready"], tmp_path),
            waker_on(ports["listen"], 1.0, 1.0) as (port, _),
        ):
            started = time.monotonic()
            while _post(url)[0] != 429:  # the picker seen healthy
                assert time.monotonic() - started < 10
                time.sleep(0.2)
            picker.answers.append(503)
            answer = exchange(port, request_bytes(streamed, "-"))
    finally:
        picker.server.stop(None).wait()
        health.stop(None).wait()
    head, _, body = answer.raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and b"text/event-stream" in head, head
    events = [e for e in dechunk(body).split(b"\n\n") if e]
    comments = [e for e in events if e == b": waking"]
    assert 3 <= len(comments) <= 4, events  # at 1, 2, 3 (and 4) s of the 4 s hold
    assert answer.first_at(b": waking") < 1.5
    data = [e.removeprefix(b"data: ") for e in events if e.startswith(b"data: ")]
    assert data[-1] == b"[DONE]" and len(data) == 2, events
    error = json.loads(data[0])["error"]
    assert (error["type"], error["code"]) == ("server_error", "model_not_ready"), error
    assert PICKER_SAYS[503] in error["message"], error


@needs_envoy
def test_the_rendered_config_at_zero_validates(tmp_path: Path) -> None:
    run = validate(router_config(zero_deployment(), limits_at_zero())["data"]["envoy.yaml"], tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr


def test_only_a_deployment_at_zero_holds() -> None:
    """The picking listener waits out the hold and rewrites refusals only at minReplicas 0; the
    picker's flow control and the waker in front of Envoy are there only."""
    for min_replicas, holds in ((0, True), (1, False)):
        ld = zero_deployment(min_replicas)
        config = router_config(ld, limits_for(ld))["data"]
        envoy = yaml.safe_load(config["envoy.yaml"])
        listeners = {x["name"]: x for x in envoy["static_resources"]["listeners"]}
        picking = listeners["picking"]["filter_chains"][0]["filters"][0]["typed_config"]
        assert ("local_reply_config" in picking) == holds
        # At zero clients reach the waker, and only it reaches Envoy (render/router/waker.py).
        openai = listeners["openai"]["address"]["socket_address"]
        assert (openai["address"], openai["port_value"]) == (
            ("127.0.0.1", 18081) if holds else ("0.0.0.0", 8080)
        )
        assert picking["request_timeout"] == ("311s" if holds else "300s")
        assert picking.get("stream_idle_timeout") == ("86400s" if holds else None)
        epp = yaml.safe_load(config["epp.yaml"])
        assert ("flowControl" in epp) == holds
        if holds:
            assert epp["featureGates"] == ["flowControl"]
            assert epp["flowControl"]["defaultRequestTTL"] == f"{HOLD_S}s"
            assert epp["flowControl"]["maxRequests"] == "20"
            assert epp["flowControl"]["defaultPriorityBand"]["maxRequests"] == "20"


def test_the_router_pod_at_zero_runs_the_waker_on_the_clients_port() -> None:
    """The Service's `openai` target is the waker's port at zero, Envoy's above; the waker runs the
    operator's image under the restricted profile, with the router's bounds."""
    images = Images(runtime="r", cpu_runtime="c", engine_builder="", trtllm_version="1.1.0", waker="op:1")
    assert router_service(zero_deployment())["spec"]["ports"][0]["targetPort"] == "openai"
    for min_replicas, holds in ((0, True), (1, False)):
        ld = zero_deployment(min_replicas)
        limits = limits_for(ld)
        pod = router_deployment(ld, images, router_config(ld, limits), limits)["spec"]["template"]["spec"]
        containers = {c["name"]: c for c in pod["containers"]}
        serving = [name for name, c in containers.items() if any(p["name"] == "openai" for p in c["ports"])]
        assert serving == (["waker"] if holds else ["envoy"]), serving
        if not holds:
            assert "waker" not in containers
            continue
        waker = containers["waker"]
        assert waker["image"] == "op:1" and waker["command"] == ["python3", "-m", "llm_operator.waker"]
        restricted = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                      "readOnlyRootFilesystem": True}  # fmt: skip
        assert waker["securityContext"] == restricted
        assert "tcpSocket" in waker["readinessProbe"]  # an HTTP probe would be held by the picker
        args = dict(zip(waker["args"][::2], waker["args"][1::2], strict=True))
        assert args["--envoy-port"] == "18081" and args["--port"] == "8080", args
        assert args["--max-connections"] == str(limits.connections), args
        assert args["--first-wait-seconds"] == "5" and args["--interval-seconds"] == "10", args
        assert int(args["--silence-seconds"]) > limits.silent_timeout_s, args


def test_the_waker_and_envoy_are_bounded_by_the_same_limits() -> None:
    """The waker refuses nothing Envoy would let through: both are rendered from the one limits
    object (render/router/objects.py limits_for), not each from the spec."""
    images = Images(runtime="r", cpu_runtime="c", engine_builder="", trtllm_version="1.1.0", waker="op:1")
    ld = zero_deployment()
    limits = dataclasses.replace(limits_for(ld), connections=7)
    envoy = yaml.safe_load(router_config(ld, limits)["data"]["envoy.yaml"])
    (monitor,) = envoy["overload_manager"]["resource_monitors"]
    assert monitor["typed_config"]["max_active_downstream_connections"] == 7
    pod = router_deployment(ld, images, router_config(ld, limits), limits)["spec"]["template"]["spec"]
    (waker,) = [c for c in pod["containers"] if c["name"] == "waker"]
    assert waker["args"][waker["args"].index("--max-connections") + 1] == "7"
