"""The waker's server: client connections on the router Service's OpenAI port, each request passed to
the router's Envoy on loopback (exchange.py), with the front door's HTTP/1.1 bounds
(frontdoor/http1.py: head and idle timeouts, header caps, the connection cap with its 503).

HTTP/2 with prior knowledge (h2c), which Envoy's listener also speaks, is passed through as bytes:
such a connection gets no comments, and Envoy's own limits only.
"""

from __future__ import annotations

import asyncio
import contextlib

from llm_operator.frontdoor import http1 as H
from llm_operator.frontdoor import protocol as P
from llm_operator.waker.activity import Activity
from llm_operator.waker.envoy import CHUNK, Pool, UpstreamError
from llm_operator.waker.exchange import Client, Exchange, Settings, log
from llm_operator.waker.stall import Watch

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"  # RFC 9113 section 3.4


class Waker:
    def __init__(self, settings: Settings, watch: Watch | None = None) -> None:
        self.settings = settings
        self.watch = watch  # None: no deployment to read (held requests wait out the hold)
        self.activity = Activity()  # the held requests, as KEDA's external-push scaler sees them
        self.pool = Pool(settings.envoy_host, settings.envoy_port)
        # The client connections' handlers, held: asyncio keeps tasks only weakly (a handler
        # whose sockets are all paused is otherwise garbage; frontdoor/server.py says more).
        self.handlers: set[asyncio.Task[object]] = set()
        self.idle = asyncio.Event()  # set while none is open (the drain at SIGTERM waits for it)
        self.idle.set()
        self.stopping = False
        self.waiting: set[asyncio.Task[object]] = set()  # connections between requests

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if (open_now := len(self.handlers)) >= self.settings.http.max_connections:
            log(f"503 to {H.client(writer)}: {open_now} connections open, the limit")
            await H.refuse(reader, writer, open_now)
            return
        handler = asyncio.current_task()
        assert handler is not None
        self.handlers.add(handler)
        self.idle.clear()
        try:
            first = await self._first_bytes(reader)
            if not first:  # nothing within the head timeout, or closed: ended unanswered
                return
            if first.startswith(H2_PREFACE):
                await self._splice(first, reader, writer)
                return
            peer = Client(reader, writer, self.settings.http, first)
            while not self.stopping and await self._one(peer):
                pass
        except (H.Gone, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.handlers.discard(handler)
            if not self.handlers:
                self.idle.set()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _first_bytes(self, reader: asyncio.StreamReader) -> bytes:
        """What the client sends first, enough to tell HTTP/2's preface (b"" at EOF or past the head
        timeout: the connection then ends unanswered, as the front door's does)."""
        data = b""
        try:
            async with asyncio.timeout(self.settings.http.head_timeout_s):
                while len(data) < len(H2_PREFACE) and H2_PREFACE.startswith(data):
                    more = await reader.read(CHUNK)
                    if not more:
                        break
                    data += more
        except (TimeoutError, OSError):
            pass
        return data

    async def _one(self, peer: Client) -> bool:
        """One request; False when the connection is to be closed."""
        try:
            task = asyncio.current_task()
            assert task is not None
            self.waiting.add(task)  # until its next request's head: stop() closes it meanwhile
            try:
                request = await peer.request()
            finally:
                self.waiting.discard(task)
            if request is None:
                return False
            assert peer.head is not None
            if peer.head.http_version != b"1.1":  # Envoy refuses HTTP/1.0 too (accept_http_10 false)
                raise P.ApiError(426, "the router speaks HTTP/1.1 (and HTTP/2), not HTTP/1.0")
            if request.method == "CONNECT":
                raise P.ApiError(405, "the router does not tunnel (CONNECT)")
        except P.ApiError as e:
            log(f"{e.status} to a request from {H.client(peer.writer)}: {e.message}")
            if peer.can_answer():
                await peer.json(e.status, e.body(), close=True)
                await peer.linger()
            return False
        try:
            up = await self.pool.get()
        except UpstreamError as e:
            log(f"503 to {request.method} {request.path[:100]} from {H.client(peer.writer)}: {e}")
            error = P.ApiError(503, f"the router's Envoy cannot be reached: {e}", kind="server_error",
                               code="router_unavailable")  # fmt: skip
            await peer.json(503, error.body(), close=True)
            await peer.linger()
            return False
        exchange = Exchange(self.settings, peer, request, up, self.watch, self.activity)
        try:
            again = await exchange.run()
        except BaseException:
            up.close()
            raise
        if exchange.complete:
            self.pool.put(up)
        else:
            up.close()
        return again

    def stop(self) -> None:
        """At SIGTERM: connections between requests are closed, the others after their answer."""
        self.stopping = True
        for task in self.waiting:
            task.cancel()

    async def _splice(self, first: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The connection's bytes to Envoy and back, unchanged, until either side closes."""
        try:
            envoy = (self.settings.envoy_host, self.settings.envoy_port)
            up_reader, up_writer = await asyncio.open_connection(*envoy)
        except OSError as e:
            log(f"HTTP/2 connection from {H.client(writer)} closed: cannot connect to Envoy: {e}")
            return
        up_writer.write(first)

        async def copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await source.read(CHUNK):
                    sink.write(data)
                    await sink.drain()  # back-pressure: read no more than the other side takes

        tasks = [asyncio.create_task(copy(reader, up_writer)), asyncio.create_task(copy(up_reader, writer))]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.gather(*tasks, return_exceptions=True)
            up_writer.transport.abort()


async def serve(waker: Waker, host: str | None, port: int) -> asyncio.Server:
    return await asyncio.start_server(waker.connection, host, port, limit=CHUNK, backlog=1024)
