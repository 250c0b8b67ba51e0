"""The front door's HTTP bounds (frontdoor/http1.py on h11) on real sockets, before a Triton
stand-in: what passes a bound gets a 4xx in OpenAI's format or its connection closed, within a
bounded time, with one line in the log and no traceback; what is read past a request while it is
answered is bounded; a long prompt is tokenized off the event loop. Limits are shrunk here so
that each is reached fast; tests/triton/test_frontdoor_limits.py holds the defaults against a
real pod."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from llm_operator.frontdoor import protocol as P
from llm_operator.frontdoor.http1 import MAX_BODY, MIN_BODY, HttpLimits, body_limit
from llm_operator.frontdoor.protocol import Limits

from tests.openai_errors import openai_error
from tests.unit.test_frontdoor_server import STREAM_HEAD, Behaviour, events, front_door, ids, sse

FAST = HttpLimits(max_head_bytes=4096, max_headers=10, max_body_bytes=64 * 1024, head_timeout_s=0.5,
                  body_timeout_s=0.5, idle_timeout_s=0.5, send_timeout_s=1.0, read_ahead_bytes=16 * 1024,
                  max_connections=4)  # fmt: skip


def test_the_body_cap_follows_max_input_len_within_1_and_16_mib() -> None:
    assert body_limit(0) == MAX_BODY == 16 * 2**20, "maxInputLen unknown: the most"
    assert body_limit(128) == body_limit(8192) == MIN_BODY == 2**20
    assert body_limit(131072) == 4 * 2**20
    assert body_limit(10**7) == MAX_BODY


@pytest.mark.parametrize("depth", [P.MAX_JSON_DEPTH + 1, 100_000])
def test_json_nested_past_the_limit_is_a_400_naming_it(depth: int) -> None:
    raw = b'{"model": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"
    with pytest.raises(P.ApiError, match="nests objects and arrays more than 64 deep") as e:
        P.parse_json(raw)
    assert e.value.status == 400
    ok = b'{"model": ' + b"[" * (P.MAX_JSON_DEPTH - 1) + b"]" * (P.MAX_JSON_DEPTH - 1) + b"}"
    assert P.parse_json(ok)["model"]


def test_a_stop_sequence_longer_than_the_limit_is_refused() -> None:
    body = {"model": "m", "prompt": "hi", "stop": ["x" * P.MAX_STOP_CHARS, "\n"]}
    assert P.check(body, "completion", Limits(), backend="cpu-reference").stop[0] == "x" * P.MAX_STOP_CHARS
    with pytest.raises(P.ApiError, match="at most 1024 characters") as e:
        P.check(
            {**body, "stop": ["x" * (P.MAX_STOP_CHARS + 1)]}, "completion", Limits(), backend="cpu-reference"
        )
    assert e.value.param == "stop"


async def nothing(w: asyncio.StreamWriter) -> None:
    raise AssertionError("no request may reach Triton")


def stream_of(tokens: int) -> Behaviour:
    """`tokens` tokens, one every 10 ms."""

    async def behaviour(w: asyncio.StreamWriter) -> None:
        w.write(STREAM_HEAD)
        for _ in range(tokens):
            w.write(sse(ids("a")))
            await w.drain()
            await asyncio.sleep(0.01)
        w.write(b"0\r\n\r\n")
        await w.drain()

    return behaviour


async def send_raw(port: int, data: bytes, *, wait: float = 5.0) -> tuple[bytes, float]:
    """Send `data` and read until the server closes: what it answered, and when it closed."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    start = time.monotonic()
    w.write(data)
    try:
        raw = await asyncio.wait_for(r.read(), wait)
    finally:
        w.close()
    return raw, time.monotonic() - start


def run(behaviour: Behaviour, tmp_path: Path, go: Any, http: HttpLimits = FAST) -> Any:
    async def main() -> Any:
        async with front_door(behaviour, tmp_path, Limits(64, 128), http=http) as port:
            return await go(port)

    return asyncio.run(main())


COMPLETION = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"


@pytest.mark.parametrize(
    ("request_bytes", "status", "says"),
    [(COMPLETION + b"Content-Length: -5\r\n\r\n{}", 400, "Content-Length"),
     (COMPLETION + b"Content-Length: 12abc\r\n\r\n{}", 400, "Content-Length"),
     (COMPLETION + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400, "Content-Length"),
     (COMPLETION + b"Transfer-Encoding: gzip\r\n\r\n", 501, "Transfer-Encoding"),
     (COMPLETION + b"X-Big: " + b"a" * 8000 + b"\r\n\r\n", 431, "head is larger than this server's limit"),
     (COMPLETION + b"".join(b"X-%d: 1\r\n" % i for i in range(11)) + b"\r\n", 431, "12 header fields"),
     (COMPLETION + b"Content-Length: 70000\r\n\r\n", 413, "limit of 64 KiB"),
     (COMPLETION + b"Transfer-Encoding: chunked\r\n\r\n" + b"8000\r\n" + b"a" * 0x8000 + b"\r\n"
      + b"8001\r\n" + b"a" * 0x8001 + b"\r\n0\r\n\r\n", 413, "limit of 64 KiB"),
     (b"GARBAGE\r\n\r\n", 400, "malformed HTTP request"),
     (b"POST /v1/completions HTTP/1.1\r\n\r\n", 400, "Host")],
    ids=["negative-content-length", "garbled-content-length", "two-content-lengths", "gzip-framing",
         "8k-header", "too-many-headers", "body-over-the-cap", "chunked-body-over-the-cap", "garbage",
         "no-host"],
)  # fmt: skip
def test_a_malformed_or_oversized_request_gets_its_4xx_and_a_closed_connection(
    request_bytes: bytes, status: int, says: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    raw, took = run(nothing, tmp_path, lambda port: send_raw(port, request_bytes))
    got, error = openai_error(raw)
    assert (got, error["type"]) == (status, "invalid_request_error") and says in error["message"], error
    assert took < 2, "answered at once, then closed"
    assert b"\r\nConnection: close\r\n" in raw
    log = capfd.readouterr().err
    assert log.count("\n") == 1 and f"llm-operator-frontdoor: {status} to " in log, log
    assert "Traceback" not in log


def test_slow_heads_and_bodies_get_a_408_idle_connections_are_closed(tmp_path: Path) -> None:
    async def go(port: int) -> list[tuple[bytes, float]]:
        return list(await asyncio.gather(
            send_raw(port, COMPLETION + b"X-Slow: "),  # a head that never ends (slow loris)
            send_raw(port, COMPLETION + b"Content-Length: 100\r\n\r\n{"),  # a body that never ends
            send_raw(port, b""),  # connected, silent
        ))  # fmt: skip

    (head, t_head), (body, t_body), (silent, t_silent) = run(nothing, tmp_path, go)
    status, error = openai_error(head)
    assert status == 408 and "head did not arrive within 0.5 s" in error["message"]
    status, error = openai_error(body)
    assert status == 408 and "body did not arrive within 0.5 s" in error["message"]
    assert silent == b"", "a connection that sent nothing is closed unanswered"
    assert all(0.4 < t < 2 for t in (t_head, t_body, t_silent)), (t_head, t_body, t_silent)


def test_a_kept_alive_connection_is_closed_after_the_idle_timeout(tmp_path: Path) -> None:
    async def go(port: int) -> tuple[bytes, float]:
        return await send_raw(port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")

    raw, took = run(nothing, tmp_path, go)
    assert raw.startswith(b"HTTP/1.1 200 OK") and raw.endswith(b"]}"), raw
    assert 0.4 < took < 2


def test_connections_past_the_cap_get_a_503_and_a_freed_slot_serves_again(tmp_path: Path) -> None:
    cap = HttpLimits(max_connections=2, idle_timeout_s=30, head_timeout_s=30)

    async def go(port: int) -> tuple[bytes, bytes, bytes]:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        await asyncio.sleep(0.1)
        refused, _ = await send_raw(port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        held[0][1].close()
        await asyncio.sleep(0.1)
        served, _ = await send_raw(port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        # The slots are the connections, not their requests: one kept alive still holds its own.
        held[1][1].write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        kept = await asyncio.wait_for(held[1][0].readuntil(b"]}"), 5)
        held[1][1].close()
        return refused, served, kept

    refused, served, kept = run(nothing, tmp_path, go, http=cap)
    status, error = openai_error(refused)
    assert (status, error["type"], error["code"]) == (503, "server_error", "too_many_connections")
    assert b"\r\nRetry-After: 1\r\n" in refused
    assert served.startswith(b"HTTP/1.1 200") and kept.startswith(b"HTTP/1.1 200")


def test_a_pipelined_flood_behind_a_stream_is_not_read_past_the_read_ahead(tmp_path: Path) -> None:
    """The client sends its stream's request, then 64 MiB without reading: the server reads 16 KiB
    past the request and leaves the rest in the socket, so TCP stops the sender; the stream is
    whole, and the flood, once parsed, is refused with the connection closed."""
    flood = 64 * 2**20

    async def go(port: int) -> tuple[bytes, int]:
        body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 60, "stream": True}).encode()
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(COMPLETION + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        sock.setblocking(False)
        sent, junk = 0, b"X" * 65536
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 0.5  # the stream lasts 0.6 s
        while sent < flood and loop.time() < deadline:
            try:
                sent += sock.send(junk)
            except BlockingIOError:
                await asyncio.sleep(0.01)
        gc.collect()  # the server's handler, its socket paused, is still held (not garbage)
        sock.setblocking(True)
        sock.settimeout(10)
        raw = b""
        with contextlib.suppress(ConnectionResetError):  # the server closes on the flood it left unread
            while chunk := await loop.run_in_executor(None, sock.recv, 1 << 20):
                raw += chunk
        sock.close()
        return raw, sent

    raw, sent = run(stream_of(60), tmp_path, go, http=HttpLimits(read_ahead_bytes=16 * 1024))
    # What the kernel took: the socket buffers of both ends (some MiB on loopback), not the flood.
    assert sent < flood / 4, f"{sent} bytes of {flood} taken while the stream ran"
    stream, _, after = raw.partition(b"0\r\n\r\n")
    texts = [json.loads(e)["choices"][0]["text"] for e in events(stream + b"0\r\n\r\n")[:-1]]
    assert "".join(texts) == "a" * 60
    assert after.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 431 ")), after[:200]


async def gone_after_first_token(seen_close: asyncio.Event) -> Behaviour:
    async def behaviour(w: asyncio.StreamWriter) -> None:
        w.write(STREAM_HEAD + sse(ids("a")))
        await w.drain()
        try:
            for _ in range(500):  # 5 s of tokens unless the front door closes the stream
                await asyncio.sleep(0.01)
                w.write(sse(ids("b")))
                await w.drain()
        except ConnectionError:
            seen_close.set()

    return behaviour


def test_a_client_that_leaves_mid_stream_ends_its_request_at_triton(tmp_path: Path) -> None:
    async def main() -> bool:
        closed = asyncio.Event()
        async with front_door(await gone_after_first_token(closed), tmp_path, Limits(64, 128)) as port:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 100, "stream": True}).encode()
            w.write(COMPLETION + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            await r.readuntil(b"data: ")
            w.close()
            await asyncio.wait_for(closed.wait(), 3)
            return closed.is_set()

    assert asyncio.run(main())


def test_a_long_prompt_is_tokenized_off_the_event_loop(tmp_path: Path) -> None:
    """A prompt of 900 KB (the cpu-reference tokenizer needs 1 to 3 s for it) arrives while
    another client streams: the stream's tokens keep coming, and the long prompt gets its 400."""

    async def go(port: int) -> tuple[float, int, dict[str, Any]]:
        gaps: list[float] = []

        async def stream() -> None:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 120, "stream": True}).encode()
            w.write(COMPLETION + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            last = time.monotonic()
            while (line := await r.readline()) and not line.startswith(b"data: [DONE]"):
                if line.startswith(b"data: "):
                    now = time.monotonic()
                    gaps.append(now - last)
                    last = now
            w.close()

        async def long_prompt() -> tuple[int, dict[str, Any]]:
            await asyncio.sleep(0.05)
            body = json.dumps({"model": "m", "prompt": "word " * 180_000}).encode()
            head = COMPLETION + b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body)
            raw, _ = await send_raw(port, head + body, wait=30)
            return openai_error(raw)

        _, (status, error) = await asyncio.gather(stream(), long_prompt())
        return max(gaps[1:]), status, error

    http = HttpLimits(max_body_bytes=2**20)
    worst, status, error = run(stream_of(500), tmp_path, go, http=http)
    assert (status, error["code"]) == (400, "context_length_exceeded")
    assert worst < 0.25, f"a stream's tokens stopped for {worst:.3f} s while a prompt was tokenized"
