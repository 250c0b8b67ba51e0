"""HTTP/1.1 on asyncio streams for the front door: a connection's buffered bytes, the request head
and body (Content-Length or chunked, `Expect: 100-continue`), and the framing of responses (JSON,
server-sent events in chunks). Kept apart from the OpenAI routes (server.py) so the transport can
be replaced whole."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from llm_operator.frontdoor import protocol as P

MAX_HEAD = 64 * 1024
MAX_BODY = 16 * 1024 * 1024
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
           408: "Request Timeout", 411: "Length Required", 413: "Payload Too Large",
           500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable"}  # fmt: skip


class Gone(Exception):
    """The client closed its connection."""


class Peer:
    """A client connection's bytes, buffered so that data read while watching for EOF during a
    response is kept for the next request."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer, self.buf = reader, writer, bytearray()
        self.held = b""  # written ahead of the next write (a stream's head, with its first event)
        self.request_id = ""  # of the request being answered: X-Request-Id on its response

    async def fill(self) -> bool:
        """False at EOF (the client is gone)."""
        try:
            data = await self.reader.read(65536)
        except OSError:
            data = b""
        self.buf += data
        return bool(data)

    async def until(self, sep: bytes, limit: int) -> bytes:
        while (i := self.buf.find(sep)) < 0:
            if len(self.buf) > limit:
                raise P.ApiError(413, "the request's headers are too large")
            if not await self.fill():
                raise Gone
        out = bytes(self.buf[: i + len(sep)])
        del self.buf[: i + len(sep)]
        return out

    async def exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not await self.fill():
                raise Gone
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out


def parse_head(raw: bytes) -> tuple[str, str, dict[str, str]]:
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise P.ApiError(400, "malformed HTTP request line")
    headers = {
        k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)
    }
    return parts[0], parts[1], headers


async def read_body(peer: Peer, headers: dict[str, str]) -> bytes:
    if headers.get("expect", "").lower() == "100-continue":
        await write(peer, b"HTTP/1.1 100 Continue\r\n\r\n")
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = bytearray()
        while True:
            try:
                size = int((await peer.until(b"\r\n", 1024)).split(b";")[0], 16)
            except ValueError:
                raise P.ApiError(400, "malformed chunked request body") from None
            if size == 0:
                await peer.until(b"\r\n", MAX_HEAD)  # no trailers are expected
                return bytes(body)
            if len(body) + size > MAX_BODY:
                raise P.ApiError(413, f"the request body is larger than {MAX_BODY // 2**20} MiB")
            body += (await peer.exactly(size + 2))[:-2]
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError:
        raise P.ApiError(400, "malformed Content-Length") from None
    if length > MAX_BODY:
        raise P.ApiError(413, f"the request body is larger than {MAX_BODY // 2**20} MiB")
    return await peer.exactly(length)


def request_id(headers: dict[str, str]) -> str:
    """The client's X-Request-Id when it is one token of at most 128 visible ASCII characters (it is
    echoed in a header), else a new one."""
    sent = headers.get("x-request-id", "")
    return sent if 0 < len(sent) <= 128 and all("!" <= c <= "~" for c in sent) else uuid.uuid4().hex


def stream_head(close: bool, request_id: str) -> bytes:
    connection = "close" if close else "keep-alive"
    return ("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            f"Transfer-Encoding: chunked\r\nX-Request-Id: {request_id}\r\n"
            f"Connection: {connection}\r\n\r\n").encode()  # fmt: skip


def chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def event(peer: Peer, obj: dict[str, Any]) -> None:
    await write(peer, chunked(b"data: " + json.dumps(obj).encode() + b"\n\n"))


async def write(peer: Peer, data: bytes) -> None:
    if peer.held:
        data, peer.held = peer.held + data, b""
    peer.writer.write(data)
    await peer.writer.drain()
