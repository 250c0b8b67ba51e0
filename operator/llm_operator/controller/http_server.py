"""The operator's own HTTP endpoints (/metrics, /healthz), bounded.

prometheus_client's server started a thread per connection and never timed one out: 2,000 idle
connections held 2,002 threads. Here every connection is a coroutine on one event loop, at most
`max_connections` are open at once (one more is closed at once, unanswered), and each has
`timeout` seconds in all to send its request head and take the answer, however slowly it sends
(slowloris). One GET per connection (`Connection: close`), as probes and Prometheus scrape.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import choose_encoder

MAX_CONNECTIONS = 64
TIMEOUT_SECONDS = 10.0
MAX_HEAD_BYTES = 8192  # a request line and headers; a longer head is cut off unanswered

# Request headers (lower-case names) -> (status, content type, body)
Route = Callable[[Mapping[str, str]], tuple[int, str, bytes]]


class BoundedServer:
    def __init__(
        self,
        routes: Mapping[str, Route],
        max_connections: int = MAX_CONNECTIONS,
        timeout: float = TIMEOUT_SECONDS,
    ) -> None:
        self.routes = routes
        self.max_connections = max_connections
        self.timeout = timeout
        self.open = 0  # connections being served now
        self.refused = 0  # connections closed at once: max_connections were open

    async def start(self, host: str, port: int) -> asyncio.Server:
        # A deep backlog: a burst is accepted (and what exceeds the cap closed) rather than left
        # to the kernel's SYN retries, which would delay honest clients by seconds.
        return await asyncio.start_server(
            self._serve, host, port, limit=MAX_HEAD_BYTES, reuse_address=True, backlog=1024
        )

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open >= self.max_connections:
            self.refused += 1
            writer.transport.abort()
            return
        self.open += 1
        try:
            async with asyncio.timeout(self.timeout):
                head = await reader.readuntil(b"\r\n\r\n")
                writer.write(self._answer(head))
                writer.close()  # once the answer is flushed, within the same time
                await writer.wait_closed()
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # a client that hung up, stalled or sent too much gets nothing more
        finally:
            self.open -= 1
            writer.transport.abort()  # a no-op once closed; else nothing lingers

    def _answer(self, head: bytes) -> bytes:
        lines = head.decode("latin-1").split("\r\n")
        method, target, *_ = [*lines[0].split(" "), "", ""]
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        route = self.routes.get(target.partition("?")[0])
        if method != "GET":
            status, content_type, body = 405, "text/plain", b"only GET\n"
        elif route is None:
            status, content_type, body = 404, "text/plain", b"not found\n"
        else:
            status, content_type, body = route(headers)
        return (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode() + body


def metrics_route(registry: CollectorRegistry = REGISTRY) -> Route:
    def metrics(headers: Mapping[str, str]) -> tuple[int, str, bytes]:
        encoder, content_type = choose_encoder(headers.get("accept", ""))
        return 200, content_type, encoder(registry)

    return metrics


def serve_metrics(port: int, host: str = "0.0.0.0", server: BoundedServer | None = None) -> Threaded:
    """/metrics (and /) from a thread of its own with its own event loop: a scrape is answered
    even while the operator's loop is busy. Returns once listening; OSError if the port is taken."""
    server = server or BoundedServer({"/metrics": metrics_route(), "/": metrics_route()})
    loop = asyncio.new_event_loop()
    listening = loop.run_until_complete(server.start(host, port))
    thread = threading.Thread(target=loop.run_forever, name="metrics-http", daemon=True)
    thread.start()
    return Threaded(server, listening, loop, thread)


@dataclass(frozen=True)
class Threaded:
    server: BoundedServer
    listening: asyncio.Server
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.listening.sockets[0].getsockname()[1])

    def stop(self) -> None:
        async def close() -> None:
            self.listening.close()
            await self.listening.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()
