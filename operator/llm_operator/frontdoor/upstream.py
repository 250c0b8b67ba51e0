"""Triton's generate API on localhost, over asyncio streams: one connection per request.

A request owns its connection, so closing it is how a generation is cancelled: Triton's HTTP
frontend cancels the request of a connection that goes away, and the model stops decoding it
(verified on the CPU runtime's Triton 2.51: tests/triton/test_frontdoor.py counts the tokens the
model produced). No pool of kept-alive connections: with one, the first token came later, not
sooner (bench P8 on the CPU runtime, two runs each: the OpenAI path's TTFT p50 8.3 and 13.1 ms
pooled, 7.5 and 7.8 ms with a new connection per request; Triton's small response writes likely
wait on delayed ACKs of a long-lived connection). Instead the connection of each request is opened
ahead, once the previous request has sent its own: the connect (p50 0.6 ms of the 0.9 ms from a
request's arrival to Triton's, profiled on the bench) is off the request's path. A spare nobody
took within SPARE_IDLE_S is closed: Triton's stop waits, up to its whole exit timeout, for every
open HTTP connection to close, so a pod that no longer gets requests must not hold one (it made
every stop after OpenAI traffic last 30 s and end with "Exit timeout expired"). Responses of
generate_stream are server-sent events, `data: {...}` per response, each with the model's outputs
(the engine contract's `output_ids` and `sequence_length`; the llmapi model's `text_output`, and
its `finish_reason` when asked for it) or an `error`. A tensor of one element is written as a
number, a longer one as a flat list. The llmapi model's outputs have a row per sequence (n: the
operator's wrapper's sampling_param_n, runtime/llmapi_structured.py): `text_output` and
`finish_reason` [n], `output_ids` and `output_log_probs` [n, len] padded with id -1; each response
becomes one Answer per sequence.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

from llm_operator.frontdoor.stall import StallWatch

Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]

MAX_HEADER = 64 * 1024
# Under the preStop drain's settle time (contract.DRAIN_SETTLE_SECONDS, 5 s): the last request's
# spare is closed before the drain lets Triton stop.
SPARE_IDLE_S = 2.0


@dataclass(frozen=True)
class Answer:
    """One response of the model: its text output (engine.py makes it from the ids on the engine
    contract), its finish reason when there is one (the llmapi model's return_finish_reason), and
    the engine contract's output ids, with the sequence they belong to (sequence_index, n > 1),
    their log-probabilities (output_log_probs, when asked for) and each id's text (engine.py)."""

    text: str
    finish_reason: str | None = None
    ids: tuple[int, ...] = ()
    index: int = 0
    log_probs: tuple[float, ...] = ()
    pieces: tuple[str, ...] = ()


class UpstreamError(Exception):
    """Triton refused or failed the request: its HTTP status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class Upstream:
    def __init__(self, host: str, port: int, stall_timeout: float = 0.0) -> None:
        self.host, self.port = host, port
        self.watch = StallWatch(stall_timeout)  # the generations in flight (stall.py)
        self._decoupled: dict[str, bool] = {}
        self._spare: asyncio.Task[Connection] | None = None
        self._spare_expiry: asyncio.TimerHandle | None = None

    def _open_spare(self) -> None:
        if self._spare is None:
            self._spare = spare = asyncio.create_task(asyncio.open_connection(self.host, self.port))
            self._spare_expiry = asyncio.get_running_loop().call_later(SPARE_IDLE_S, self._drop_spare, spare)

    def _drop_spare(self, spare: asyncio.Task[Connection]) -> None:
        if self._spare is spare:
            self._spare = self._spare_expiry = None
        if not spare.done():
            spare.cancel()
        elif not spare.cancelled() and spare.exception() is None:
            spare.result()[1].close()

    async def _connect(self) -> tuple[Connection, bool]:
        """A new connection, opened ahead of the request that takes it (True) or now (False)."""
        spare, self._spare = self._spare, None
        if self._spare_expiry is not None:
            self._spare_expiry.cancel()
            self._spare_expiry = None
        if spare is not None:
            with contextlib.suppress(OSError):
                reader, writer = await spare
                if not reader.at_eof():
                    return (reader, writer), True
                writer.close()
        try:
            return await asyncio.open_connection(self.host, self.port), False
        except OSError as e:
            raise UpstreamError(503, f"the model server is not reachable ({e.strerror or e})") from None

    async def _request(self, method: str, path: str, body: bytes = b"") -> tuple[
        asyncio.StreamReader, asyncio.StreamWriter, int, dict[str, str]
    ]:  # fmt: skip
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nConnection: close\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")  # fmt: skip
        while True:
            (reader, writer), ahead = await self._connect()
            writer.write(head.encode() + body)
            # The next request's connection is opened now, while Triton works on this one: not
            # before this request is sent (starting the connect costs tens of microseconds).
            self._open_spare()
            try:
                raw = await reader.readuntil(b"\r\n\r\n")
                break
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError) as e:
                writer.close()
                # One opened ahead that Triton closed (a restart) before reading the request: again.
                if not (ahead and isinstance(e, asyncio.IncompleteReadError) and not e.partial):
                    raise UpstreamError(503, "the model server closed the connection") from None
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)
        }
        return reader, writer, status, headers

    async def json(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        reader, writer, status, headers = await self._request(
            method, path, json.dumps(body).encode() if body is not None else b""
        )
        try:
            raw = b"".join([part async for part in _body(reader, headers)])
        finally:
            writer.close()
        try:
            data = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            data = {"error": raw.decode(errors="replace")}
        if status != 200:
            raise UpstreamError(status, str(data.get("error", data)))
        return dict(data)

    async def decoupled(self, model: str) -> bool:
        """Whether the model streams (runtime.streaming: true renders a decoupled model), from its
        configuration as Triton loaded it; remembered once known."""
        if model not in self._decoupled:
            config = await self.json("GET", f"/v2/models/{model}/config")
            self._decoupled[model] = bool(config.get("model_transaction_policy", {}).get("decoupled"))
        return self._decoupled[model]

    async def generate(
        self, model: str, inputs: dict[str, Any], stream: bool, sequences: int = 0
    ) -> AsyncGenerator[Answer, None]:
        """Each response, in order (`sequences` > 0: the llmapi model's, an Answer per sequence).
        Leaving the loop early (or cancelling the task) closes the connection, which cancels the
        request in Triton."""
        path = f"/v2/models/{model}/generate_stream" if stream else f"/v2/models/{model}/generate"
        watch, now = self.watch, time.monotonic
        watch.began(now())
        try:
            reader, writer, status, headers = await self._request("POST", path, json.dumps(inputs).encode())
            try:
                if status != 200:
                    raw = b"".join([part async for part in _body(reader, headers)])
                    watch.answered(now())
                    raise UpstreamError(status, _message(raw))
                if not stream:
                    whole = b"".join([part async for part in _body(reader, headers)])
                    watch.answered(now())
                    for answer in _answers(json.loads(whole), sequences):
                        yield answer
                    return
                pending = b""
                async for part in _body(reader, headers):
                    pending += part
                    while b"\n\n" in pending:
                        event, pending = pending.split(b"\n\n", 1)
                        for line in event.split(b"\n"):
                            if line.startswith(b"data:"):
                                watch.answered(now())
                                for answer in _answers(_event(line[5:]), sequences):
                                    yield answer
            finally:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
        finally:
            watch.ended()


def _event(data: bytes) -> dict[str, Any]:
    try:
        event = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        event = None
    if not isinstance(event, dict):
        raise UpstreamError(502, "the model server sent an event that is not a JSON object")
    return event


def _answer(response: dict[str, Any]) -> Answer:
    if "error" in response:
        raise UpstreamError(500, str(response["error"]))
    reason = _string(response.get("finish_reason"))
    ids = _ids(response)
    index = _ints(response.get("sequence_index"))
    return Answer(_string(response.get("text_output", "")), reason or None, ids, index[0] if index else 0,
                  _log_probs(response.get("output_log_probs"), len(ids)))  # fmt: skip


def _answers(response: dict[str, Any], sequences: int) -> list[Answer]:
    if not sequences:
        return [_answer(response)]
    if "error" in response:
        raise UpstreamError(500, str(response["error"]))
    texts = _row(response.get("text_output"), sequences)
    reasons = _row(response.get("finish_reason"), sequences)
    ids, values = _ints(response.get("output_ids")), response.get("output_log_probs")
    width = len(ids) // sequences
    if len(ids) != width * sequences:
        raise UpstreamError(502, f"the model server sent output_ids that are not {sequences} rows")
    log_probs = _log_probs(values, len(ids)) if values is not None else ()
    answers = []
    for i in range(sequences):
        row = ids[i * width : (i + 1) * width]
        length = next((n for n, id_ in enumerate(row) if id_ < 0), len(row))  # padded with -1
        reason = reasons[i] if reasons and reasons[i] not in ("", "None") else None
        row_log_probs = log_probs[i * width : i * width + length] if log_probs else ()
        answers.append(Answer(texts[i] if texts else "", reason, row[:length], i, row_log_probs))
    return answers


def _row(value: Any, sequences: int) -> list[str]:
    """A BYTES output of one entry per sequence (none when absent)."""
    if value is None:
        return []
    values = [str(v) for v in value] if isinstance(value, list) else [str(value)]
    if len(values) != sequences:
        raise UpstreamError(502, f"the model server sent {len(values)} texts for {sequences} sequences")
    return values


def _log_probs(value: Any, ids: int) -> tuple[float, ...]:
    """The new ids' log-probabilities: the trailing entries, right whether the engine sends those
    of the new ids or of all so far (which TensorRT-LLM does when streaming is unverified)."""
    if value is None or not ids:
        return ()
    values = value if isinstance(value, list) else [value]
    if len(values) < ids or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        raise UpstreamError(502, "the model server sent log-probabilities that do not match its ids")
    return tuple(float(v) for v in values[len(values) - ids :])


def _ids(response: dict[str, Any]) -> tuple[int, ...]:
    """Beam 0's output_ids, cut at its sequence_length (the rest of a beam is padding)."""
    ids, length = _ints(response.get("output_ids")), _ints(response.get("sequence_length"))
    return ids[: length[0]] if length else ids


def _ints(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise UpstreamError(502, "the model server sent token ids that are not integers")
    return tuple(values)


def _string(value: Any) -> str:
    """A BYTES output: Triton's generate API writes one element as a string, more as a list."""
    if value is None:
        return ""
    return "".join(map(str, value)) if isinstance(value, list) else str(value)


def _message(raw: bytes) -> str:
    try:
        return str(json.loads(raw).get("error", raw.decode(errors="replace")))
    except (json.JSONDecodeError, AttributeError):
        return raw.decode(errors="replace")


async def _body(reader: asyncio.StreamReader, headers: dict[str, str]) -> AsyncIterator[bytes]:
    """The response body as it arrives: chunked transfer coding, a Content-Length, or to EOF."""
    try:
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    return  # the connection is closed next: its empty trailer section is not read
                data = await reader.readexactly(size + 2)
                yield data[:-2]
        elif "content-length" in headers:
            yield await reader.readexactly(int(headers["content-length"]))
        else:
            yield await reader.read()
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, OSError):
        raise UpstreamError(502, "the model server ended its response early") from None
