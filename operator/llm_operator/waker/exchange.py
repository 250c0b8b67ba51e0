"""One request through the waker: forwarded to the router's Envoy as it arrives (head at once, the
body chunk by chunk, each written before the next is read), the answer relayed as it comes. Only a
streamed generation request whose answer has not begun within the first wait is changed: the waker
answers its head itself (200, an event stream) and sends `: waking` comments until Envoy's head
comes; then Envoy's event stream is relayed as is, and any other answer becomes one SSE error event
(docs/autoscaling.md, "Progress while held").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from dataclasses import dataclass
from typing import Any

import h11

from llm_operator.frontdoor import http1 as H
from llm_operator.frontdoor import protocol as P
from llm_operator.waker.activity import Activity
from llm_operator.waker.envoy import Connection, UpstreamError, end_to_end
from llm_operator.waker.stall import Watch

GENERATION_ROUTES = ("/v1/completions", "/v1/chat/completions")
# No answer head within this: a held request. A warm replica's front door sends a stream's head with
# its first token, well within it; one slower than this gets comments, which SSE clients skip.
FIRST_WAIT_S = 5.0
# Then a comment this often: a third of the shortest idle timeout common in front of HTTP services
# (30 s; nginx's proxy_read_timeout and AWS load balancers' idle timeout are 60 s).
INTERVAL_S = 10.0
COMMENT = b": waking\n\n"
# What the waker reads of an answer it turns into an SSE error event: OpenAI's error objects, Envoy's
# plain-text replies; beyond, the text is cut.
ERROR_BYTES = 64 * 1024
# A body larger than this is parsed for `stream` on a worker thread.
INLINE_PARSE_BYTES = 64 * 1024


@dataclass(frozen=True)
class Settings:
    envoy_port: int
    # The client side's bounds (frontdoor/http1.py): head, body and idle timeouts, header caps, the
    # connection cap; max_body_bytes is what is kept of a generation request's body to read `stream`
    # from (the front door's body cap: a larger body is refused there, streamed or not).
    http: H.HttpLimits
    first_wait_s: float = FIRST_WAIT_S
    interval_s: float = INTERVAL_S
    # How long Envoy's answer may stay silent: Envoy's own limit (86,400 s) ends it first.
    silence_s: float = 86_400.0 + 60.0
    envoy_host: str = "127.0.0.1"
    # What a client refused at once is told to wait: the router's (render/scale_to_zero.py).
    retry_after_s: int = 5
    deployment: str = ""  # the LLMDeployment whose status is read while requests are held


def log(line: str) -> None:
    """One line of the container's log, as the front door writes its own (frontdoor/http1.py log)."""
    print(f"llm-operator-waker: {line}".replace("\n", " "), file=sys.stderr, flush=True)


class Client(H.Peer):
    """The front door's client connection (h11, its bounds), with the raw head of the request kept
    for forwarding as received. `first`: bytes the server read before (to tell HTTP/2), given to h11
    as the connection's first read."""

    head: h11.Request | None = None

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limits: H.HttpLimits,
                 first: bytes = b"") -> None:  # fmt: skip
        super().__init__(reader, writer, limits)
        self.first = first

    async def _receive(self, deadline: float | None) -> int | None:
        if self.first:
            data, self.first = self.first, b""
            self.conn.receive_data(data)
            return len(data)
        return await super()._receive(deadline)

    def _next(self) -> Any:
        event = super()._next()
        if isinstance(event, h11.Request):
            self.head = event
        return event

    def next_event(self) -> Any:
        return self._next()

    async def receive(self, deadline: float) -> int | None:
        return await self._receive(deadline)


def asks_stream(body: bytes) -> bool:
    """Whether an OpenAI request body asks for a stream (`"stream": true`)."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return False
    return isinstance(parsed, dict) and parsed.get("stream") is True


def error_payload(status: int, reason: bytes, body: bytes) -> dict[str, Any]:
    """An answer other than an event stream, as the data of one SSE error event: OpenAI's error
    object as Envoy sent it (the hold's 503 and 429, the front door's 4xx), else one made from its
    status and text (Envoy's own plain-text replies)."""
    with contextlib.suppress(ValueError):
        parsed = json.loads(body)
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
            return parsed
    text = body.decode("utf-8", "replace").strip()[:1000]
    kind = "server_error" if status >= 500 else "invalid_request_error"
    message = f"the router answered {status} {reason.decode('latin-1')}" + (f": {text}" if text else "")
    return P.ApiError(status, message, kind=kind).body()


class Exchange:
    """One request and its answer; run() says whether the client's connection may carry another."""

    def __init__(self, settings: Settings, peer: Client, request: H.Request, up: Connection,
                 watch: Watch | None = None, activity: Activity | None = None) -> None:  # fmt: skip
        assert peer.head is not None
        self.settings, self.peer, self.request, self.up = settings, peer, request, up
        self.watch = watch  # the deployment's status, read while a generation request is held
        self.activity = activity  # what KEDA is pushed (push.py): held generation requests
        self.head = peer.head
        loop = asyncio.get_running_loop()
        self.generation = request.path in GENERATION_ROUTES
        self.inspect = self.generation and request.method == "POST"
        self.kept: list[bytes] | None = [] if self.inspect else None  # the body, to read `stream`
        self.body_end: asyncio.Future[None] = loop.create_future()
        self.pump: asyncio.Task[None] | None = None
        self.waking = False  # our own head is sent: the answer goes on as an event stream
        self.complete = False  # the answer ended as it should (Envoy's connection may be reused)

    async def run(self) -> bool:
        peer = self.peer
        try:
            forwarded = h11.Request(method=self.head.method, target=self.head.target,
                                    headers=end_to_end(self.head.headers.raw_items()))  # fmt: skip
            await self.up.send(forwarded, self.settings.silence_s)
            self.pump = asyncio.create_task(self._pump())
            head = asyncio.create_task(self._head())
            try:
                response = await self._await_head(head)
            finally:
                await _cancel(head)
            relay = asyncio.create_task(self._relay(response))
            try:
                await self._wait(relay)
            finally:
                await _cancel(relay)
            relay.result()
            self.complete = True
        except P.ApiError as e:  # the request itself: late, malformed body
            log(f"{e.status} to {self._what()}: {e.message}")
            if not peer.can_answer():
                raise H.Gone from None
            await peer.json(e.status, e.body(), close=True)
            await peer.linger()
            return False
        except UpstreamError as e:
            log(f"502 to {self._what()}: {e}")
            await self._upstream_failed(e)
            return False
        except Refused as e:
            log(f"503 to {self._what()}: {e}")
            await self._refuse(str(e))
            return False
        finally:
            if self.pump is not None:
                await _cancel(self.pump)
        # A body Envoy answered before it was whole is left unread: that connection ends.
        return self.body_end.done() and not self.request.close

    def _loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    def _what(self) -> str:
        return f"{self.request.method} {self.request.path[:100]} from {H.client(self.peer.writer)}"

    async def _head(self) -> h11.Response:
        """Envoy's response head. A generation request waiting for it is held: counted in what KEDA is
        pushed (push.py), and Refused first if the deployment's status says no replica can start (its
        Envoy connection is then closed: the picker drops the request)."""
        response = asyncio.ensure_future(self.up.response(self._loop().time() + self.settings.silence_s))
        if not self.generation:
            return await response
        with self.activity.holding() if self.activity is not None else contextlib.nullcontext():
            if self.watch is None:
                return await response
            return await self._unless_refused(response, self.watch)

    async def _unless_refused(self, response: asyncio.Future[h11.Response], watch: Watch) -> h11.Response:
        with watch.holding():
            refused = asyncio.ensure_future(watch.refused())
            either: set[asyncio.Future[Any]] = {response, refused}
            try:
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            finally:
                await _cancel(refused)
                if not response.done():
                    await _cancel(response)
        if response.cancelled() and refused.done() and not refused.cancelled():
            raise Refused(refused.result())
        return response.result()

    async def _refuse(self, message: str) -> None:
        """The hold's refusal, at once: a 503 with Retry-After, or one SSE error event in a stream the
        waker has begun."""
        error = P.ApiError(503, message, kind="server_error", code="model_not_ready")
        if self.waking and self.peer.conn.our_state is h11.SEND_BODY:
            await self._events(error.body())
        elif self.peer.can_answer():
            retry = [(b"Retry-After", b"%d" % self.settings.retry_after_s)]
            await self.peer.json(503, error.body(), close=True, headers=retry)
            await self.peer.linger()
        else:
            raise H.Gone from None

    async def _upstream_failed(self, e: UpstreamError) -> None:
        error = P.ApiError(502, f"the router's Envoy failed: {e}", kind="server_error",
                           code="router_unavailable")  # fmt: skip
        if self.waking and self.peer.conn.our_state is h11.SEND_BODY:
            await self._events(error.body())
        elif self.peer.can_answer():
            await self.peer.json(502, error.body(), close=True)
        else:
            raise H.Gone from None

    async def _pump(self) -> None:
        """The request's body to Envoy as it comes, a copy kept to read `stream` from (up to the
        body cap); then the client's connection watched for its EOF (until_gone), and read ahead.
        Envoy may take the body slowly while the picker holds the request: its own timeouts bound
        that, not the client's send timeout."""
        peer, http = self.peer, self.settings.http
        if peer.conn.they_are_waiting_for_100_continue:  # Expect is not forwarded: answered here
            go_on = h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue")
            await peer.write(peer.conn.send(go_on) or b"")
        deadline = self._loop().time() + http.body_timeout_s
        size = 0
        while True:
            event = peer.next_event()
            if event is h11.NEED_DATA:
                if await peer.receive(deadline) is None:
                    raise P.ApiError(408, f"the request body did not arrive within {http.body_timeout_s:g} s")
                continue
            if isinstance(event, h11.Data):
                size += len(event.data)
                if self.kept is not None and size <= http.max_body_bytes:
                    self.kept.append(event.data)
                elif self.kept is not None:
                    self.kept = None  # over the cap: no longer kept, still forwarded
                await self.up.send(h11.Data(data=event.data), self.settings.silence_s)
            elif isinstance(event, h11.EndOfMessage):
                await self.up.send(h11.EndOfMessage(), self.settings.silence_s)
                break
            else:
                raise H.Gone
        self.body_end.set_result(None)
        await peer.until_gone()

    async def _wait(self, *tasks: asyncio.Future[Any], within: float | None = None) -> bool:
        """Waits until one of `tasks` is done (True) or `within` seconds pass (False); raises at once
        when the client is gone (EOF on a generation route, as the front door: a client that half-closes
        after another request is still answered) or its request failed."""
        loop = self._loop()
        deadline = None if within is None else loop.time() + within
        assert self.pump is not None
        while not any(t.done() for t in tasks):
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return False
            waits = {*tasks} | ({self.pump} if not self.pump.done() else set())
            done, _ = await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            if self.pump in done and not any(t.done() for t in tasks):
                if self.pump.cancelled():
                    raise H.Gone
                failed = self.pump.exception()
                if failed is not None:
                    raise failed
                if self.generation:  # EOF: the client left; its held or running request is dropped
                    raise H.Gone
        return True

    async def _await_head(self, head: asyncio.Task[h11.Response]) -> h11.Response:
        settings = self.settings
        if await self._wait(head, within=settings.first_wait_s) or not self.inspect:
            await self._wait(head)
            return head.result()
        await self._wait(head, self.body_end)  # whole before it can be read
        if head.done() or not await self._asks_stream():
            await self._wait(head)
            return head.result()
        self.waking = True
        ours = h11.Response(status_code=200, reason=b"OK", headers=[
            (b"Content-Type", b"text/event-stream"), (b"Cache-Control", b"no-cache")])  # fmt: skip
        await self.peer.write((self.peer.conn.send(ours) or b"") + self._data(COMMENT))
        while not await self._wait(head, within=settings.interval_s):
            await self.peer.write(self._data(COMMENT))
        return head.result()

    async def _asks_stream(self) -> bool:
        if self.kept is None:  # over the body cap: the front door refuses it, streamed or not
            return False
        body = b"".join(self.kept)
        if len(body) <= INLINE_PARSE_BYTES:
            return asks_stream(body)
        return await asyncio.to_thread(asks_stream, body)

    async def _relay(self, response: h11.Response) -> None:
        peer = self.peer
        if not self.waking:
            headers = end_to_end(response.headers.raw_items())
            as_sent = h11.Response(status_code=response.status_code, headers=headers, reason=response.reason)
            await peer.write(peer.conn.send(as_sent) or b"")
        elif not _event_stream(response):
            await self._events(await self._error_payload(response))
            return
        while True:
            event = await self.up.next(self._loop().time() + self.settings.silence_s)
            if isinstance(event, h11.Data):
                await peer.write(self._data(event.data))
            elif isinstance(event, h11.EndOfMessage):
                await peer.write(peer.conn.send(h11.EndOfMessage()) or b"")
                return

    async def _error_payload(self, response: h11.Response) -> dict[str, Any]:
        parts, size = [], 0
        while size <= ERROR_BYTES:
            event = await self.up.next(self._loop().time() + self.settings.silence_s)
            if isinstance(event, h11.EndOfMessage):
                break
            if isinstance(event, h11.Data):
                parts.append(event.data)
                size += len(event.data)
        return error_payload(response.status_code, response.reason, b"".join(parts)[:ERROR_BYTES])

    async def _events(self, payload: dict[str, Any]) -> None:
        """One SSE error event and the end of the stream, as the front door ends a stream that
        failed (its error event, then [DONE])."""
        peer = self.peer
        data = peer.event_bytes(json.dumps(payload).encode()) + peer.event_bytes(b"[DONE]")
        await peer.write(data + (peer.conn.send(h11.EndOfMessage()) or b""))

    def _data(self, data: bytes) -> bytes:
        return self.peer.conn.send(h11.Data(data=data)) or b""


class Refused(Exception):
    """The deployment's status says no replica can start: the message to answer with."""


def _event_stream(response: h11.Response) -> bool:
    if response.status_code != 200:
        return False
    types = [v for n, v in response.headers.raw_items() if n.lower() == b"content-type"]
    return bool(types) and types[0].split(b";")[0].strip().lower() == b"text/event-stream"


async def _cancel(task: asyncio.Future[Any]) -> None:
    if not task.done():
        task.cancel()
    with contextlib.suppress(BaseException):
        await task
