"""The operator's HTTP endpoints (controller/http_server.py) on real sockets on 127.0.0.1: idle and
slow connections cost no thread each, are capped and timed out, and /metrics answers a new client
once they are gone. Timeouts are shortened here to keep the tests fast."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from llm_operator.controller.cluster import leader
from llm_operator.controller.http_server import BoundedServer, Threaded, metrics_route, serve_metrics

from e2e.cluster.processes import free_port

CAP, TIMEOUT, PATIENT = 16, 0.5, 3.0


def threads() -> int:
    """This process's threads as the kernel counts them (not only Python's)."""
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))


def serving(timeout: float) -> Iterator[Threaded]:
    server = BoundedServer({"/metrics": metrics_route()}, max_connections=CAP, timeout=timeout)
    served = serve_metrics(0, "127.0.0.1", server)
    yield served
    served.stop()


@pytest.fixture
def metrics() -> Iterator[Threaded]:
    yield from serving(TIMEOUT)


@pytest.fixture
def patient() -> Iterator[Threaded]:
    """Long enough a timeout to open every connection of a test before the first one ends."""
    yield from serving(PATIENT)


def get(port: int, path: str = "/metrics", method: str = "GET") -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def closed_by_server(s: socket.socket, within: float) -> bool:
    s.settimeout(within)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_metrics_are_served_and_nothing_else(metrics: Threaded) -> None:
    status, text = get(metrics.port)
    assert status == 200 and "llm_operator_reconcile_duration_seconds" in text
    assert get(metrics.port, "/metrics?x=1")[0] == 200
    assert get(metrics.port, "/other")[0] == 404
    assert get(metrics.port, "/metrics", "POST")[0] == 405


def test_idle_connections_take_no_thread_each_are_capped_and_timed_out(patient: Threaded) -> None:
    before = threads()
    start = time.monotonic()
    idle = [connect(patient.port) for _ in range(300)]
    try:
        while patient.server.open + patient.server.refused < len(idle) and time.monotonic() < start + 2:
            time.sleep(0.01)
        assert time.monotonic() - start < PATIENT, "too slow a machine for this test's timeout"
        assert patient.server.open == CAP and patient.server.refused == len(idle) - CAP
        assert threads() <= before, "a thread per connection"
        # Beyond the cap, a new client is closed at once, unanswered.
        assert closed_by_server(connect(patient.port), within=0.5)
        # Once the idle ones have had their time, a scrape gets through.
        time.sleep(max(0.0, start + PATIENT + 0.3 - time.monotonic()))
        assert patient.server.open == 0
        assert all(closed_by_server(s, within=0.5) for s in idle)
        assert get(patient.port)[0] == 200
    finally:
        for s in idle:
            s.close()


def test_a_slow_client_gets_the_timeout_in_all_not_per_byte(metrics: Threaded) -> None:
    slow = connect(metrics.port)
    start = time.monotonic()
    try:
        for byte in b"GET /metrics HTTP/1.1\r\nHost: x\r\n":
            slow.sendall(bytes([byte]))
            time.sleep(0.05)
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert closed_by_server(slow, within=5)
    assert time.monotonic() - start < TIMEOUT + 0.5
    slow.close()


def test_an_endless_request_head_is_cut_off(metrics: Threaded) -> None:
    s = connect(metrics.port)
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        s.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 100_000)
    assert closed_by_server(s, within=TIMEOUT / 2)
    s.close()


def test_a_taken_port_is_an_error_at_start(metrics: Threaded) -> None:
    with pytest.raises(OSError, match="in use"):
        serve_metrics(metrics.port, "127.0.0.1")


async def test_health_is_served_standing_by_and_leading_by_the_bounded_server() -> None:
    port = free_port()
    seen: list[tuple[int, str]] = []

    async def operator(term: leader.Term) -> None:
        seen.append(await asyncio.to_thread(get, port, "/healthz"))
        # The same bounds as /metrics: an idle connection is not waited for forever.
        s = await asyncio.to_thread(connect, port)
        assert not await asyncio.to_thread(closed_by_server, s, 0.2)
        s.close()

    assert await leader.run(None, port, operator) == 0
    assert seen == [(200, "{}")]
    with pytest.raises(ConnectionRefusedError):
        connect(port).recv(1)  # the port is closed with the operator


def test_health_says_whether_this_replica_leads() -> None:
    from llm_operator.controller.cluster.lease import ElectionConfig

    health = leader.Health(ElectionConfig("op", "ops", "me", 15, 10, 2))
    assert health.route({}) == (
        200,
        "application/json",
        b'{"leaderElection": {"lease": "ops/op", "leading": false}}',
    )
    health.leading = True
    assert b'"leading": true' in health.route({})[2]


def test_the_server_thread_is_one_whatever_the_load(metrics: Threaded) -> None:
    names = [t.name for t in threading.enumerate()]
    assert names.count("metrics-http") == 1


def test_a_large_answer_arrives_whole_before_the_connection_closes() -> None:
    body = b"x" * 3_000_000  # far beyond a socket's buffers: the close must wait for the flush
    server = BoundedServer({"/big": lambda _: (200, "text/plain", body)}, timeout=TIMEOUT * 4)
    served = serve_metrics(0, "127.0.0.1", server)
    try:
        status, text = get(served.port, "/big")
        assert status == 200 and len(text) == len(body)
    finally:
        served.stop()
