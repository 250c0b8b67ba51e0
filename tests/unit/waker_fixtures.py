"""The waker (llm_operator/waker/) on a real socket in a thread of its own, and a stand-in for the
router's Envoy behind it (a real HTTP/1.1 server on 127.0.0.1) that answers as each request's
`x-fake` header says: late or at once, streamed or not, with the hold's 503."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from llm_operator.frontdoor.http1 import HttpLimits
from llm_operator.waker import push as push_mod
from llm_operator.waker.exchange import Settings
from llm_operator.waker.server import Waker, serve
from llm_operator.waker.stall import Watch

HOLD_503 = {
    "error": {
        "message": "no replica could take the request within the router's hold of 3 s",
        "type": "server_error",
        "param": None,
        "code": "model_not_ready",
    }
}
EVENTS = [
    b'data: {"choices":[{"text":"Once"}]}\n\n',
    b'data: {"choices":[{"text":" upon"}]}\n\n',
    b"data: [DONE]\n\n",
]
JSON_ANSWER = b'{"choices":[{"text":"Once upon"}]}'


@dataclass
class Seen:
    """What the stand-in saw: requests (method, path, headers, body), and clients that left it."""

    requests: list[tuple[str, str, list[tuple[str, str]], bytes]] = field(default_factory=list)
    gone: int = 0
    connections: int = 0


def _left(sock: socket.socket) -> bool:
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""


class _FakeEnvoy(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: Seen

    def setup(self) -> None:
        super().setup()
        self.seen.connections += 1

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _hold(self, seconds: float) -> bool:
        """Holds the request; False if its client (the waker) left meanwhile."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if _left(self.connection):
                self.seen.gone += 1
                return False
            time.sleep(0.02)
        return True

    def do_GET(self) -> None:
        self.do_POST()

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", 0))
        body = self.rfile.read(length) if length else b""
        if len(body) < length:  # its client left mid-body: Envoy passes no partial request on
            self.seen.gone += 1
            self.close_connection = True
            return
        self.seen.requests.append((self.command, self.path, list(self.headers.items()), body))
        kind, _, delay = self.headers.get("x-fake", "json:0").partition(":")
        if not self._hold(float(delay or 0)):
            self.close_connection = True
            return
        if kind == "stream":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("X-Request-Id", "from-the-front-door")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for event in EVENTS:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
                time.sleep(0.05)
            self.wfile.write(b"0\r\n\r\n")
            return
        status, payload, extra = 200, JSON_ANSWER, {}
        if kind == "hold":
            status, payload, extra = 503, json.dumps(HOLD_503).encode(), {"retry-after": "5"}
        elif kind == "plain":
            status, payload = 504, b"upstream request timeout"
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if kind != "plain" else "text/plain")
        self.send_header("Content-Length", str(len(payload)))
        for name, value in extra.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)


class _Quiet(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a connection the waker dropped (a client gone, a body given up): no traceback


@dataclass
class Running:
    port: int  # the waker's
    envoy_port: int
    seen: Seen
    waker: Waker
    push_port: int = 0  # KEDA's external-push scaler (waker/push.py), when asked for


@contextlib.contextmanager
def running(first_wait_s: float = 0.5, interval_s: float = 0.3, watch: Watch | None = None,
            push: bool = False, **limits: float) -> Iterator[Running]:  # fmt: skip
    """A stand-in Envoy and a waker in front of it, both on 127.0.0.1; `watch`: the deployment's
    status as the waker reads it; `push`: the waker serves KEDA's external-push scaler too."""
    seen = Seen()
    handler = type("Handler", (_FakeEnvoy,), {"seen": seen})
    envoy = _Quiet(("127.0.0.1", 0), handler)
    threading.Thread(target=envoy.serve_forever, daemon=True).start()
    envoy_port = int(envoy.server_address[1])
    try:
        push_ports: list[int] | None = [] if push else None
        with waker_on(envoy_port, first_wait_s, interval_s, watch, push_ports, **limits) as (port, waker):
            yield Running(port, envoy_port, seen, waker, push_ports[0] if push_ports else 0)
    finally:
        envoy.shutdown()
        envoy.server_close()


@contextlib.contextmanager
def waker_on(
    envoy_port: int, first_wait_s: float, interval_s: float, watch: Watch | None = None,
    push: list[int] | None = None, **limits: float,
) -> Iterator[tuple[int, Waker]]:  # fmt: skip
    """The waker on a free port of 127.0.0.1, in front of Envoy (or a stand-in) at `envoy_port`, on
    an event loop of its own thread; with `push`, its external-push scaler too, whose port is
    appended to it."""
    http_limits = HttpLimits(**limits)  # type: ignore[arg-type]
    settings = Settings(envoy_port=envoy_port, http=http_limits, first_wait_s=first_wait_s,
                        interval_s=interval_s)  # fmt: skip
    waker = Waker(settings, watch)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    server: list[asyncio.Server] = []
    scalers: list[Any] = []

    async def start() -> None:
        server.append(await serve(waker, "127.0.0.1", 0))
        if push is not None:
            scaler, port = await push_mod.serve(waker.activity, "127.0.0.1:0")
            scalers.append(scaler)
            push.append(port)
        started.set()

    async def stop() -> None:
        server[0].close()
        for scaler in scalers:
            waker.activity.close()
            await scaler.stop(grace=1.0)
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        waker.pool.close()

    thread = threading.Thread(
        target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True
    )
    thread.start()
    assert started.wait(10)
    try:
        yield server[0].sockets[0].getsockname()[1], waker
    finally:
        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def request_bytes(body: dict[str, object] | None, fake: str, path: str = "/v1/completions",
                  method: str = "POST") -> bytes:  # fmt: skip
    data = json.dumps(body).encode() if body is not None else b""
    return (f"{method} {path} HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
            f"X-Fake: {fake}\r\nContent-Length: {len(data)}\r\n\r\n").encode() + data  # fmt: skip


@dataclass
class Timed:
    """A raw answer read as it came: (seconds since the request, bytes) per read."""

    reads: list[tuple[float, bytes]]

    @property
    def raw(self) -> bytes:
        return b"".join(data for _, data in self.reads)

    def first_at(self, needle: bytes) -> float:
        """When the bytes up to and including `needle` had arrived."""
        got = b""
        for at, data in self.reads:
            got += data
            if needle in got:
                return at
        raise AssertionError(f"{needle!r} never came: {got!r}")


def exchange(port: int, raw: bytes, timeout: float = 20.0, until: bytes = b"0\r\n\r\n") -> Timed:
    """Sends `raw`, reads until `until` is in the answer, or EOF."""
    reads: list[tuple[float, bytes]] = []
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        started = time.monotonic()
        sock.sendall(raw)
        got = b""
        while until not in got:
            data = sock.recv(65536)
            if not data:
                break
            got += data
            reads.append((time.monotonic() - started, data))
    return Timed(reads)


def dechunk(body: bytes) -> bytes:
    """A chunked body's content."""
    out, rest = b"", body
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if not size:
            break
        out, rest = out + rest[:size], rest[size + 2 :]
    return out
