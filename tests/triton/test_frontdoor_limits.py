"""Bad input against a real front door process: a leader pod's processes (the launcher, the CPU
runtime's tritonserver, the front door with its default limits: frontdoor/http1.py HttpLimits, its
body cap from the pod's maxInputLen of 128 tokens, 1 MiB) and real sockets.

Each attack must end in a 4xx in OpenAI's error format or a closed connection within a bounded
time; the front door's resident memory (VmRSS) may grow by at most 64 MiB and must come back down;
a stream that another client runs back to back all along keeps streaming, its p99 gap between two
tokens at most twice what it is without the attacks (with a few ms of slack for this machine's
scheduling). The pod's log has one line per refusal and no traceback.
"""

from __future__ import annotations

import contextlib
import json
import resource
import selectors
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from llm_operator.runtime.processes import descendants, process_table

from tests.openai_errors import openai_error
from tests.triton.leader import LeaderPod, leader_pod
from tests.triton.test_frontdoor import NAMES, spec

pytestmark = pytest.mark.triton

MIB = 2**20
RSS_GROWTH = 64 * MIB
HEAD_TIMEOUT_S = 10  # HttpLimits.head_timeout_s, the default
# 1,000 slow heads, or what this process's file limit leaves (the test holds one socket each).
LORIS = min(1000, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 200)
COMPLETION = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"


# A client streaming completions back to back on one kept-alive connection, in a process of its
# own (the attacks' own work in this one would delay its reads): one line per token, "when gap".
STREAMER = """
import json, socket, sys, time
body = json.dumps({"model": sys.argv[2], "prompt": "Once upon a time", "max_tokens": 120,
                   "temperature": 0, "ignore_eos": True, "stream": True}).encode()
head = b"POST /v1/completions HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: %d\\r\\n\\r\\n" % len(body)
request = head + body
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=30) as s:
    while True:
        s.sendall(request)
        pending, last = b"", None
        while not pending.endswith(b"\\r\\n0\\r\\n\\r\\n"):
            chunk = s.recv(65536)
            if not chunk:
                sys.exit("the front door closed the stream's connection")
            now, pending = time.monotonic(), pending + chunk
            for _ in range(chunk.count(b'"text": "') - chunk.count(b'"text": ""')):
                if last is not None:
                    print(now, now - last, flush=True)
                last = now
"""


@dataclass
class Watch:
    """The front door's VmRSS, sampled every 10 ms, and the token times of a stream run back to back."""

    pod: LeaderPod
    pid: int
    rss: list[tuple[float, int]] = field(default_factory=list)
    gaps: list[tuple[float, float]] = field(default_factory=list)  # (when, seconds since the last token)
    stop: threading.Event = field(default_factory=threading.Event)

    def rss_now(self) -> int:
        status = Path(f"/proc/{self.pid}/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) * 1024

    def sample(self) -> None:
        while not self.stop.wait(0.01):
            self.rss.append((time.monotonic(), self.rss_now()))

    def read(self, streamer: subprocess.Popen[str]) -> None:
        assert streamer.stdout is not None
        for line in streamer.stdout:
            when, gap = line.split()
            self.gaps.append((float(when), float(gap)))

    def p99_gap(self, start: float, end: float) -> float:
        gaps = [g for t, g in self.gaps if start <= t <= end]
        assert len(gaps) > 100, f"the stream got {len(gaps)} tokens in {end - start:.1f} s"
        return statistics.quantiles(gaps, n=100)[98]

    def peak_rss(self, start: float, end: float) -> int:
        return max(r for t, r in self.rss if start <= t <= end)


@pytest.fixture(scope="module")
def watch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Watch]:
    try:
        with leader_pod(tmp_path_factory.mktemp("limits"), spec(), NAMES) as pod:
            table = process_table()
            pids = descendants(table, pod.process.pid)
            pid = next(p for p in pids if "llm_operator.frontdoor" in table[p][1])
            w = Watch(pod, pid)
            streamer = subprocess.Popen([sys.executable, "-c", STREAMER, str(pod.openai_port), NAMES[0]],
                                        stdout=subprocess.PIPE, text=True)  # fmt: skip
            threads = [threading.Thread(target=w.sample, daemon=True),
                       threading.Thread(target=w.read, args=(streamer,), daemon=True)]  # fmt: skip
            for t in threads:
                t.start()
            time.sleep(5)  # the baseline: the stream alone
            yield w
            assert streamer.poll() is None, "the stream ended"
            w.stop.set()
            streamer.kill()
            streamer.wait()
            for t in threads:
                t.join(timeout=30)
    except RuntimeError as e:
        pytest.fail(str(e))


@pytest.fixture(scope="module")
def baseline(watch: Watch) -> int:
    """The front door's RSS before any attack."""
    return watch.rss_now()


# The stream's p99 gap during an attack against the 2 s before it: at most twice, with this much
# slack (`make test` runs this tier beside the e2e streams on 2 cores: a 9.5 ms p99 went to 31.7 ms
# there on 2026-11-30 with nothing wrong), and no gap past LONGEST_GAP_S (a front door whose loop
# stops for a tokenization shows seconds: 2.3 s for a 900 KB prompt, 35 s for 15 MiB).
GAP_SLACK_S = 0.050
LONGEST_GAP_S = 0.5


@contextlib.contextmanager
def attack(watch: Watch, base_rss: int, name: str) -> Iterator[None]:
    """Around one attack: the stream's gaps in the 2 s before it, the memory and the gaps while
    it lasts (at least 2 s), and the memory after."""
    time.sleep(2)
    start = time.monotonic()
    before = watch.p99_gap(start - 2, start)
    yield
    time.sleep(max(0.0, start + 2 - time.monotonic()))
    end = time.monotonic()
    peak, during = watch.peak_rss(start, end), watch.p99_gap(start, end)
    longest = max(g for t, g in watch.gaps if start <= t <= end)
    deadline = time.monotonic() + 10
    while (after := watch.rss_now()) > base_rss + RSS_GROWTH / 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    print(f"{name}: front door RSS {base_rss / MIB:.1f} MiB before, peak {peak / MIB:.1f}, after "
          f"{after / MIB:.1f}; stream p99 gap {before * 1000:.1f} ms before, {during * 1000:.1f} ms "
          f"during (longest {longest * 1000:.0f} ms)")  # fmt: skip
    assert peak - base_rss <= RSS_GROWTH, f"{name}: RSS grew by {(peak - base_rss) / MIB:.1f} MiB"
    assert after - base_rss <= RSS_GROWTH / 4, f"{name}: RSS stayed {(after - base_rss) / MIB:.1f} MiB up"
    assert during <= 2 * before + GAP_SLACK_S, (
        f"{name}: the stream's p99 gap went {before:.4f} -> {during:.4f} s"
    )
    assert longest < LONGEST_GAP_S, f"{name}: the stream stopped for {longest:.3f} s"


def answer(port: int, data: bytes, *, send_all: bool = True, timeout: float = 10) -> tuple[bytes, float]:
    """Send `data` (as much as the server takes before answering), read to the close."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        with contextlib.suppress(ConnectionError):
            s.sendall(data) if send_all else s.send(data)
        raw = b""
        with contextlib.suppress(ConnectionError):
            while chunk := s.recv(65536):
                raw += chunk
    return raw, time.monotonic() - start


def body_of(doc: dict[str, Any], close: bool = True) -> bytes:
    data = json.dumps(doc).encode()
    connection = b"Connection: close\r\n" if close else b""
    return COMPLETION + connection + b"Content-Length: %d\r\n\r\n%s" % (len(data), data)


NESTED = b'{"model": "tiny", "prompt": "hi", "user": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
CAP = "limit of 1024 KiB"  # the body cap of maxInputLen 128
CASES: dict[str, tuple[Callable[[], bytes], int, str]] = {
    "a 15 MiB prompt": (lambda: body_of({"model": "tiny", "prompt": "x" * 15 * MIB}), 413, CAP),
    "a 100 KiB header": (lambda: COMPLETION + b"X-Big: " + b"a" * 100 * 1024 + b"\r\n\r\n", 431,
                         "head is larger"),
    "a negative Content-Length": (lambda: COMPLETION + b"Content-Length: -1\r\n\r\n{}", 400,
                                  "Content-Length"),
    "nested JSON": (lambda: COMPLETION + b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
                    % (len(NESTED), NESTED), 400, "nests"),
    "a stop list of 8 MiB": (lambda: body_of({"model": "tiny", "prompt": "hi", "stop": ["s" * 2 * MIB] * 4}),
                             413, CAP),
    "a stop list under the body cap": (
        lambda: body_of({"model": "tiny", "prompt": "hi", "stop": ["s" * 200_000] * 4}), 400,
        "at most 1024 characters"),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_each_bad_request_gets_its_4xx_at_once_at_bounded_cost(
    watch: Watch, baseline: int, case: str
) -> None:
    make, status, says = CASES[case]
    data = make()
    with attack(watch, baseline, case):
        for _ in range(5):
            raw, took = answer(watch.pod.openai_port, data)
            got, error = openai_error(raw)
            assert (got, error["type"]) == (status, "invalid_request_error"), error
            assert says in error["message"], error
            assert took < 3, f"{case}: answered in {took:.1f} s"


def test_slow_heads_are_answered_408_and_closed_within_the_head_timeout(watch: Watch, baseline: int) -> None:
    """LORIS connections each send a request head one byte a second."""
    with attack(watch, baseline, f"{LORIS} slow heads"):
        start = time.monotonic()
        port = watch.pod.openai_port
        socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(LORIS)]
        selector = selectors.DefaultSelector()
        got: dict[socket.socket, bytes] = {}
        for s in socks:
            s.sendall(COMPLETION + b"X-Slow: ")
            s.setblocking(False)
            selector.register(s, selectors.EVENT_READ)
            got[s] = b""
        closed: dict[socket.socket, float] = {}
        next_byte = time.monotonic() + 1
        while len(closed) < len(socks) and time.monotonic() < start + HEAD_TIMEOUT_S + 15:
            for key, _ in selector.select(timeout=0.2):
                ready = key.fileobj
                assert isinstance(ready, socket.socket)
                try:
                    chunk = ready.recv(65536)
                except ConnectionError:
                    chunk = b""
                got[ready] += chunk
                if not chunk:
                    closed[ready] = time.monotonic() - start
                    selector.unregister(ready)
            if time.monotonic() >= next_byte:
                next_byte += 1
                for s in socks:
                    if s not in closed:
                        with contextlib.suppress(OSError):
                            s.send(b"x")
        for s in socks:
            s.close()
    assert len(closed) == LORIS, f"{LORIS - len(closed)} slow heads still open"
    assert max(closed.values()) < HEAD_TIMEOUT_S + 10, max(closed.values())
    statuses = [openai_error(raw)[0] for raw in got.values()]
    assert statuses == [408] * LORIS


def test_a_pipelined_flood_behind_a_stream_is_left_unread(watch: Watch, baseline: int) -> None:
    """A client streams an answer while it sends up to 512 MiB more on the same connection: the
    front door reads 64 KiB past the request, TCP stops the sender, the stream is whole, and the
    flood is refused once its turn comes (then read and dropped for the lingering close's
    seconds, never kept)."""
    flood = 512 * MIB
    request = body_of({"model": "tiny", "prompt": "Once upon a time", "max_tokens": 240, "temperature": 0,
                       "ignore_eos": True, "stream": True}, close=False)  # fmt: skip
    junk = b"X" * MIB
    with (
        attack(watch, baseline, "a pipelined flood"),
        socket.create_connection(("127.0.0.1", watch.pod.openai_port), timeout=10) as s,
    ):
        s.sendall(request)
        s.setblocking(False)
        sent, raw, deadline = 0, b"", time.monotonic() + 3
        during = None  # bytes the front door had taken when the stream ended
        with contextlib.suppress(ConnectionError):  # refused and closed, its lingering read over
            while sent < flood and time.monotonic() < deadline:
                with contextlib.suppress(BlockingIOError):
                    sent += s.send(junk)
                with contextlib.suppress(BlockingIOError):
                    raw += s.recv(1 << 20)
                if during is None and b"\r\n0\r\n\r\n" in raw:
                    during = sent
                time.sleep(0.001)
        s.setblocking(True)
        with contextlib.suppress(ConnectionError):
            while chunk := s.recv(1 << 20):
                raw += chunk
    assert during is not None, "the stream did not end while the flood was sent"
    print(f"a pipelined flood: {during / MIB:.1f} MiB taken while the stream ran, {sent / MIB:.1f} MiB "
          "in all (the rest read and dropped by the lingering close after the refusal)")  # fmt: skip
    assert during < 64 * MIB
    stream, _, after = raw.partition(b"\r\n0\r\n\r\n")
    assert b'"finish_reason": "length"' in stream and b"data: [DONE]" in stream
    assert after.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 431 ")), after[:200]


def test_the_log_has_a_line_per_refusal_and_no_traceback(watch: Watch) -> None:
    log = watch.pod.log.read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]
    assert log.count("llm-operator-frontdoor: 408 to a request") >= LORIS
    assert log.count("llm-operator-frontdoor: 413 to POST /v1/completions") >= 10
