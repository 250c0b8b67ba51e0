"""HTTP/1.1 for the front door: h11 parses requests and frames responses (python-hyper/h11 0.16.0,
the parser uvicorn and httpx use; pinned in pyproject.toml, shipped to NVIDIA's image with the
injected library: llm_operator/inject.py), this module drives it on asyncio streams and bounds every
connection. h11 does no I/O, so a generation stays a task that a client's EOF cancels, and a
stream's head goes out with its first event. Kept apart from the OpenAI routes (server.py).

Each bound below is a default a user can read in docs/serving-api.md, "Limits"; what passes one
gets a 4xx in OpenAI's error format, or its connection closed, and one line in the pod's log.
"""

from __future__ import annotations

import asyncio
import json
import sys
import traceback
import uuid
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import h11

from llm_operator.frontdoor import protocol as P

MAX_BODY = 16 * 2**20
MIN_BODY = 2**20
BODY_BYTES_PER_TOKEN = 32  # a token's share of a body: JSON-escaped CJK runs ~24 bytes a token
CHUNK = 65536
# Reading and dropping what a refused client still sends, before closing: at most this long, and
# this much (a body the cap refused on its Content-Length, still on its way).
LINGER_S = 2.0
LINGER_BYTES = MAX_BODY


@dataclass(frozen=True)
class HttpLimits:
    max_head_bytes: int = 64 * 1024  # request line and headers (h11's max_incomplete_event_size): 431
    max_headers: int = 100  # header fields, as Envoy's default: 431
    max_body_bytes: int = MAX_BODY  # 413; body_limit() sizes it from maxInputLen
    head_timeout_s: float = 10.0  # a request's first byte (a new connection's accept) to its head's end: 408
    body_timeout_s: float = 60.0  # from the head's end to the body's: 408
    idle_timeout_s: float = 60.0  # a kept-alive connection without a request: closed
    send_timeout_s: float = 60.0  # a write the client does not take: closed, its generation cancelled
    # Read past a request while it is answered, for its EOF (a client gone cancels the generation)
    # and a pipelined request; beyond, the socket is left unread (TCP stops the sender).
    read_ahead_bytes: int = 64 * 1024
    max_connections: int = 4096  # open at once; more are answered 503 (server.py caps it by the fd limit)


def body_limit(max_input_len: int) -> int:
    """A request body's cap for a model of maxInputLen tokens (0: unknown): 32 bytes a token,
    within 1 and 16 MiB."""
    if not max_input_len:
        return MAX_BODY
    return min(MAX_BODY, max(MIN_BODY, BODY_BYTES_PER_TOKEN * max_input_len))


class Gone(Exception):
    """The client closed its connection, or stopped taking what we send."""


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # the target without its query
    headers: dict[str, str]  # lower-case names; a repeated field's values joined with ", "
    close: bool  # the client asked to close after this request


def _too_large(limit: int) -> P.ApiError:
    return P.ApiError(413, f"the request body is larger than this server's limit of {limit // 1024} KiB")


def _refusal(e: h11.RemoteProtocolError, limits: HttpLimits) -> P.ApiError:
    status = e.error_status_hint if e.error_status_hint in (400, 431, 501) else 400
    if status == 431:  # h11's only 431: its receive buffer past max_incomplete_event_size
        return P.ApiError(431, f"the request's head is larger than this server's limit of "
                          f"{limits.max_head_bytes // 1024} KiB")  # fmt: skip
    detail = str(e)
    detail = detail if len(detail) <= 160 else detail[:160] + "..."  # h11 may quote what it refused
    return P.ApiError(status, f"malformed HTTP request: {detail}")


class Peer:
    """One client connection: h11's state, the bytes read past the current request, and the
    response being written (its head held until the first event)."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limits: HttpLimits
    ) -> None:
        self.reader, self.writer, self.limits = reader, writer, limits
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_head_bytes)
        self.held = b""  # written ahead of the next write (a stream's head, with its first event)
        self.request_id = ""  # of the request being answered: X-Request-Id on its response
        self.eof = False
        self.requests = 0

    async def _receive(self, deadline: float | None) -> int | None:
        """Read once into h11 (b"" at EOF): how many bytes, None if none came by the deadline."""
        if self.eof:
            return 0
        try:
            async with asyncio.timeout_at(deadline):
                data = await self.reader.read(CHUNK)
        except TimeoutError:
            return None
        except OSError:
            data = b""
        self.eof = not data
        self.conn.receive_data(data)
        return len(data)

    def _buffered(self) -> int:
        """Bytes read and not yet parsed (h11 copies them: called once per request)."""
        return len(self.conn.trailing_data[0])

    def _next(self) -> Any:
        try:
            return self.conn.next_event()
        except h11.RemoteProtocolError as e:
            if self.eof:
                raise Gone from None
            raise _refusal(e, self.limits) from None

    async def request(self) -> Request | None:
        """The next request's head, or None: the client ended the connection between requests
        (EOF, or no byte within the idle timeout). ApiError: a malformed, oversized or late head."""
        if self.requests:
            if self.conn.our_state is not h11.DONE or self.conn.their_state is not h11.DONE:
                return None  # closing (Connection: close, HTTP/1.0, a body left unread)
            self.conn.start_next_cycle()
        loop, limits = asyncio.get_running_loop(), self.limits
        # A new connection has the head timeout from its accept; a kept-alive one the idle timeout
        # until a byte of its next request arrives, then the head timeout.
        idle = bool(self.requests) and not self._buffered()
        deadline = loop.time() + (limits.idle_timeout_s if idle else limits.head_timeout_s)
        got = not idle and bool(self.requests)
        while (event := self._next()) is h11.NEED_DATA:
            read = await self._receive(deadline)
            if read is None:
                if not got:  # nothing of a request came: closed without an answer
                    return None
                raise P.ApiError(408, f"the request's head did not arrive within {limits.head_timeout_s:g} s")
            if read and not got:
                got = True
                if idle:
                    deadline = loop.time() + limits.head_timeout_s
        if isinstance(event, h11.ConnectionClosed):
            return None
        assert isinstance(event, h11.Request), event
        self.requests += 1
        # h11 checks its buffer only while a head is incomplete: one that came whole in a read is
        # measured here (its line and fields, as sent less optional whitespace).
        size = len(event.method) + len(event.target) + 12 + sum(len(n) + len(v) + 4 for n, v in event.headers)
        if size > limits.max_head_bytes:
            raise _refusal(h11.RemoteProtocolError("head too large", error_status_hint=431), limits)
        if len(event.headers) > limits.max_headers:
            count = len(event.headers)
            raise P.ApiError(431, f"the request has {count} header fields, more than {limits.max_headers}")
        headers: dict[str, str] = {}
        for name, value in event.headers:
            key = name.decode("latin-1")
            text = value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        close = "close" in headers.get("connection", "").lower() or event.http_version == b"1.0"
        path = event.target.decode("latin-1").split("?", 1)[0]
        return Request(event.method.decode("latin-1"), path, headers, close)

    async def body(self, request: Request, limit: int) -> bytes:
        """The request's body, refused (413) past `limit` bytes before it is read where its
        Content-Length says so; read within the body timeout (408)."""
        length = request.headers.get("content-length")
        if length is not None and int(length) > limit:  # h11 let only digits through
            raise _too_large(limit)
        if self.conn.they_are_waiting_for_100_continue:
            go_on = h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue")
            await self.write(self.conn.send(go_on) or b"")
        deadline = asyncio.get_running_loop().time() + self.limits.body_timeout_s
        parts, size = [], 0
        while True:
            event = self._next()
            if event is h11.NEED_DATA:
                if await self._receive(deadline) is None:
                    late = self.limits.body_timeout_s
                    raise P.ApiError(408, f"the request body did not arrive within {late:g} s")
                continue
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > limit:
                    raise _too_large(limit)
                parts.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return b"".join(parts)
            else:
                raise Gone

    async def until_gone(self) -> None:
        """Returns when the client has closed its side (EOF) while its request is answered; what it
        sends meanwhile (a pipelined request) is kept for h11, up to read_ahead_bytes, after which
        nothing more is read until the answer is done."""
        ahead = self._buffered()
        while ahead < self.limits.read_ahead_bytes and not self.eof:
            ahead += await self._receive(None) or 0
        if not self.eof:
            await asyncio.Event().wait()  # cancelled once the answer is done

    async def linger(self) -> None:
        """Before closing on a refused request whose bytes may still be coming (a body over the
        cap, a slow head): our side shut, and what the client sends read and dropped until it
        closes, for LINGER_S and LINGER_BYTES at most. A close with unread bytes would be a reset, which can
        destroy the answer before the client reads it (nginx's lingering close)."""
        await _linger(self.reader, self.writer)

    def _head(self, status: int, headers: list[tuple[bytes, bytes]], close: bool) -> bytes:
        if self.request_id:
            headers.append((b"X-Request-Id", self.request_id.encode()))
        if close:
            headers.append((b"Connection", b"close"))
        try:
            reason = HTTPStatus(status).phrase.encode()
        except ValueError:
            reason = b"Error"
        return self.conn.send(h11.Response(status_code=status, headers=headers, reason=reason)) or b""

    def can_answer(self) -> bool:
        """Whether no response of this request has started: an error can still be sent as one."""
        return self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE) and not self.held

    async def json(self, status: int, body: dict[str, Any], close: bool,
                   headers: list[tuple[bytes, bytes]] | None = None) -> None:  # fmt: skip
        data = json.dumps(body).encode()
        fields = [(b"Content-Type", b"application/json"), (b"Content-Length", b"%d" % len(data))]
        head = self._head(status, fields + (headers or []), close)
        await self.write(head + (self.conn.send(h11.Data(data=data)) or b"") + self._end())

    def start_stream(self, close: bool) -> None:
        """A stream's head, sent with its first event: one segment, one wake-up of the client."""
        headers = [(b"Content-Type", b"text/event-stream"), (b"Cache-Control", b"no-cache")]
        self.held = self._head(200, headers, close)

    def event_bytes(self, data: bytes) -> bytes:
        return self.conn.send(h11.Data(data=b"data: " + data + b"\n\n")) or b""

    async def event(self, obj: dict[str, Any]) -> None:
        await self.write(self.event_bytes(json.dumps(obj).encode()))

    async def end_stream(self) -> None:
        await self.write(self.event_bytes(b"[DONE]") + self._end())

    def _end(self) -> bytes:
        return self.conn.send(h11.EndOfMessage()) or b""

    async def write(self, data: bytes) -> None:
        if self.held:
            data, self.held = self.held + data, b""
        transport = self.writer.transport
        if transport.is_closing():
            raise Gone
        self.writer.write(data)
        if not transport.get_write_buffer_size():
            return
        try:
            async with asyncio.timeout(self.limits.send_timeout_s):
                await self.writer.drain()
        except TimeoutError:
            raise Gone from None


def log(line: str) -> None:
    """One line of the pod's log: a refusal says its status, request, client and why."""
    print(f"llm-operator-frontdoor: {line}", file=sys.stderr, flush=True)


def client(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "a client"


def defect(e: BaseException) -> str:
    """An unexpected exception in one line: its type, message and innermost frame."""
    frames = traceback.extract_tb(e.__traceback__)
    where = f" at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else ""
    return f"{type(e).__name__}: {str(e)[:200]}{where}"


def request_id(headers: dict[str, str]) -> str:
    """The client's X-Request-Id when it is one token of at most 128 visible ASCII characters (it is
    echoed in a header), else a new one."""
    sent = headers.get("x-request-id", "")
    return sent if 0 < len(sent) <= 128 and all("!" <= c <= "~" for c in sent) else uuid.uuid4().hex


async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, open_now: int) -> None:
    """A connection past the cap: a 503 in OpenAI's format (the SDK retries it), then a lingering
    close (Peer.linger)."""
    error = P.ApiError(503, f"the server has {open_now} connections open, its limit; retry shortly",
                       kind="server_error", code="too_many_connections")  # fmt: skip
    body = json.dumps(error.body()).encode()
    writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\nRetry-After: 1\r\nConnection: close\r\n\r\n%s"
                 % (len(body), body))  # fmt: skip
    await _linger(reader, writer)
    if writer.transport.get_write_buffer_size():
        writer.transport.abort()  # the client takes nothing: no flush to wait for
    else:
        writer.close()


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        async with asyncio.timeout(LINGER_S):
            if writer.can_write_eof() and not writer.transport.is_closing():
                writer.write_eof()
            dropped = 0
            while dropped < LINGER_BYTES and (data := await reader.read(CHUNK)):
                dropped += len(data)
    except (OSError, TimeoutError):
        pass
