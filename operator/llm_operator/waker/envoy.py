"""The waker's side towards the router's Envoy: HTTP/1.1 connections on loopback, h11 as the client
(python-hyper/h11 0.16.0, as the front door's server side: frontdoor/http1.py), kept alive and
reused between requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import h11

CHUNK = 65536
# A kept-alive connection unused this long is closed rather than reused: well within the Envoy
# listener's idle timeout (300 s, render/router/limits.py), so Envoy never closes one under a request
# the waker is sending on it.
POOL_IDLE_S = 60.0
POOL_SIZE = 256  # idle connections kept at most


class UpstreamError(Exception):
    """Envoy cannot be reached, closed the connection, or sent what h11 cannot parse."""


class Connection:
    """One connection to Envoy: h11's client state over an asyncio stream."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.conn = h11.Connection(h11.CLIENT)
        self.used = asyncio.get_running_loop().time()

    async def send(self, event: h11.Event, timeout_s: float) -> None:
        """Writes one event, waiting (back-pressure) while Envoy does not take it."""
        try:
            data = self.conn.send(event)
        except h11.LocalProtocolError as e:  # a framing the client's own head promised and broke
            raise UpstreamError(f"cannot forward: {e}") from None
        if not data:
            return
        if self.writer.transport.is_closing():
            raise UpstreamError("Envoy closed the connection")
        self.writer.write(data)
        try:
            async with asyncio.timeout(timeout_s):
                await self.writer.drain()
        except TimeoutError:
            raise UpstreamError(f"Envoy took nothing for {timeout_s:g} s") from None
        except OSError as e:
            raise UpstreamError(f"Envoy's connection failed: {e}") from None

    async def next(self, deadline: float) -> h11.Event:
        """Envoy's next event (response head, body data, end), read as needed until the deadline."""
        while True:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError as e:
                raise UpstreamError(f"Envoy's answer could not be read: {e}") from None
            if event is not h11.NEED_DATA:
                if isinstance(event, h11.ConnectionClosed) or not isinstance(event, h11.Event):
                    raise UpstreamError("Envoy closed the connection")
                return event
            try:
                async with asyncio.timeout_at(deadline):
                    data = await self.reader.read(CHUNK)
            except TimeoutError:
                raise UpstreamError("Envoy's answer did not come in time") from None
            except OSError:
                data = b""
            self.conn.receive_data(data)

    async def response(self, deadline: float) -> h11.Response:
        """The response head (1xx heads skipped: the waker answers 100-continue itself)."""
        while True:
            event = await self.next(deadline)
            if isinstance(event, h11.Response):
                return event
            if not isinstance(event, h11.InformationalResponse):
                raise UpstreamError(f"Envoy sent {type(event).__name__} before a response head")

    def reusable(self) -> bool:
        """Both messages complete, keep-alive, and Envoy has not closed its side."""
        return self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE and self.alive()

    def alive(self) -> bool:
        return not self.reader.at_eof() and not self.writer.transport.is_closing()

    def close(self) -> None:
        self.writer.transport.abort()  # unsent bytes are of a request given up: no flush


class Pool:
    """Connections to Envoy at (host, port), the idle ones reused most recent first."""

    def __init__(self, host: str, port: int, connect_timeout_s: float = 5.0) -> None:
        self.host, self.port, self.connect_timeout_s = host, port, connect_timeout_s
        self.idle: list[Connection] = []

    async def get(self) -> Connection:
        now = asyncio.get_running_loop().time()
        self._expire(now)
        while self.idle:
            connection = self.idle.pop()
            if connection.alive():
                connection.used = now
                return connection
            connection.close()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                reader, writer = await asyncio.open_connection(self.host, self.port, limit=CHUNK)
        except (OSError, TimeoutError) as e:
            raise UpstreamError(f"cannot connect to Envoy at {self.host}:{self.port}: {e}") from None
        return Connection(reader, writer)

    def put(self, connection: Connection) -> None:
        """Back for the next request if it can carry one, else closed."""
        if not connection.reusable() or len(self.idle) >= POOL_SIZE:
            connection.close()
            return
        connection.conn.start_next_cycle()
        connection.used = asyncio.get_running_loop().time()
        self.idle.append(connection)

    def _expire(self, now: float) -> None:
        keep = [c for c in self.idle if now - c.used < POOL_IDLE_S]
        for connection in self.idle:
            if now - connection.used >= POOL_IDLE_S:
                connection.close()
        self.idle = keep

    def close(self) -> None:
        for connection in self.idle:
            connection.close()
        self.idle = []


# Fields of one hop, not of the request (RFC 9110 section 7.6.1): each connection has its own.
# Framing (Content-Length, Transfer-Encoding) is kept: h11 frames the forwarded message by it.
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"upgrade",
                        b"expect"})  # fmt: skip


FRAMING = frozenset({b"content-length", b"transfer-encoding", b"host"})  # never dropped


def end_to_end(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The fields to forward, as received (case and order), less the hop-by-hop ones and those the
    Connection field names."""
    fields = list(headers)
    named = {
        token.strip().lower()
        for name, value in fields
        if name.lower() == b"connection"
        for token in value.split(b",")
    }
    drop = HOP_BY_HOP | (named - FRAMING)
    return [(name, value) for name, value in fields if name.lower() not in drop]
