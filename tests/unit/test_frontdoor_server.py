"""The front door's HTTP behaviour where a real Triton cannot be made to misbehave on demand: a
Triton stand-in on a real socket answers generate_stream with a few tokens and then fails, or
refuses the request. A stream that fails mid-way must end with an error event and [DONE]."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from llm_operator.frontdoor.http1 import HttpLimits
from llm_operator.frontdoor.protocol import Limits
from llm_operator.frontdoor.server import FrontDoor, Settings, serve
from llm_operator.frontdoor.tokenizer import Tokenizer
from llm_operator.frontdoor.upstream import Upstream
from llm_operator.runtime.cpu_reference import tokenizer_files

Behaviour = Callable[[asyncio.StreamWriter], Awaitable[None]]


def sse(obj: dict[str, Any]) -> bytes:
    data = b"data: " + json.dumps(obj).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def ids(text: str) -> dict[str, Any]:
    """The engine contract's response of the cpu-reference tokenizer's ids (its bytes) for `text`:
    one id as a number, several as a list, as Triton's generate API writes a tensor."""
    out = list(text.encode())
    return {"output_ids": out[0] if len(out) == 1 else out, "sequence_length": len(out)}


async def dies_after_two_tokens(w: asyncio.StreamWriter) -> None:
    w.write(STREAM_HEAD + sse(ids("a")) + sse(ids("b")))
    await w.drain()
    w.transport.abort()  # Triton gone mid-stream: no final chunk


async def errs_after_one_token(w: asyncio.StreamWriter) -> None:
    w.write(STREAM_HEAD + sse(ids("a")) + sse({"error": "engine failed"}) + b"0\r\n\r\n")
    await w.drain()


async def garbles_after_one_token(w: asyncio.StreamWriter) -> None:
    garbage = b"data: {x\n\n"
    w.write(STREAM_HEAD + sse(ids("a")) + b"%x\r\n%s\r\n0\r\n\r\n" % (len(garbage), garbage))
    await w.drain()


async def refuses(w: asyncio.StreamWriter) -> None:
    body = json.dumps({"error": "max_tokens must be 1..10"}).encode()
    w.write(b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(body), body))  # fmt: skip
    await w.drain()


async def fake_triton(behaviour: Behaviour, seen: list[dict[str, Any]]) -> asyncio.Server:
    """Triton's model config says decoupled; every other request gets `behaviour`, its JSON body
    appended to `seen`."""

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        head = (await r.readuntil(b"\r\n\r\n")).decode()
        length = int(next((line.split(":")[1] for line in head.split("\r\n")
                           if line.lower().startswith("content-length")), "0"))  # fmt: skip
        body = await r.readexactly(length)
        if body:
            seen.append(json.loads(body))
        if head.startswith("GET /v2/models/") and head.split(" ", 2)[1].endswith("/config"):
            body = json.dumps({"model_transaction_policy": {"decoupled": True}}).encode()
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await w.drain()
        else:
            await behaviour(w)
        w.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


async def exchange(
    port: int, body: dict[str, Any], path: str = "/v1/completions", headers: bytes = b""
) -> tuple[int, bytes]:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body).encode()
    w.write(b"POST %s HTTP/1.1\r\nHost: x\r\n%sConnection: close\r\nContent-Length: %d\r\n\r\n%s"
            % (path.encode(), headers, len(data), data))  # fmt: skip
    raw = await asyncio.wait_for(r.read(), 10)
    w.close()
    return int(raw.split(b" ", 2)[1]), raw


@contextlib.asynccontextmanager
async def front_door(
    behaviour: Behaviour,
    tmp_path: Path,
    limits: Limits | None = None,
    seen: list[dict[str, Any]] | None = None,
    template_suffix: str = "",
    backend: str = "cpu-reference",
    http: HttpLimits | None = None,
    tool_parser: str = "",
    template_prefix: str = "",
    unguided: str = "",
) -> AsyncIterator[int]:
    """A front door for the cpu-reference tokenizer (its chat template between template_prefix and
    template_suffix) before a Triton stand-in; yields its port."""
    tokenizer_files.write(tmp_path)
    config = tmp_path / "tokenizer_config.json"
    doc = json.loads(config.read_text())
    config.write_text(
        json.dumps({**doc, "chat_template": template_prefix + doc["chat_template"] + template_suffix})
    )
    triton = await fake_triton(behaviour, [] if seen is None else seen)
    upstream = Upstream("127.0.0.1", triton.sockets[0].getsockname()[1])
    settings = Settings(["m"], "tensorrt_llm", backend, limits or Limits(), http=http or HttpLimits(),
                        tool_parser=tool_parser, unguided=unguided)  # fmt: skip
    door = FrontDoor(settings, Tokenizer.load(tmp_path), upstream)
    server = await serve(door, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        triton.close()


def run(behaviour: Behaviour, body: dict[str, Any], tmp_path: Path) -> tuple[int, bytes]:
    async def go() -> tuple[int, bytes]:
        async with front_door(behaviour, tmp_path, Limits(64, 128)) as port:
            return await exchange(port, body)

    return asyncio.run(go())


def events(raw: bytes) -> list[str]:
    """The SSE data lines of a chunked response, in order."""
    body = raw.split(b"\r\n\r\n", 1)[1]
    out, rest = [], body
    while rest:
        size_line, rest = rest.split(b"\r\n", 1)
        size = int(size_line, 16)
        if size == 0:
            break
        out += [line[6:].decode() for line in rest[:size].split(b"\n") if line.startswith(b"data: ")]
        rest = rest[size + 2 :]
    return out


@pytest.mark.parametrize("behaviour", [dies_after_two_tokens, errs_after_one_token, garbles_after_one_token])
def test_a_stream_that_fails_midway_ends_with_an_error_event_and_done(
    behaviour: Behaviour, tmp_path: Path
) -> None:
    status, raw = run(behaviour, {"model": "m", "prompt": "hi", "max_tokens": 5, "stream": True}, tmp_path)
    assert status == 200
    got = events(raw)
    assert got[-1] == "[DONE]"
    error = json.loads(got[-2])["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "server_error"
    text = "".join(json.loads(e)["choices"][0]["text"] for e in got[:-2])
    assert text == ("ab" if behaviour is dies_after_two_tokens else "a")
    assert b"Traceback" not in raw
    assert raw.endswith(b"0\r\n\r\n")  # the response is complete, not a dropped connection


def test_tritons_refusal_before_the_first_token_is_a_400_not_a_stream(tmp_path: Path) -> None:
    status, raw = run(refuses, {"model": "m", "prompt": "hi", "max_tokens": 5, "stream": True}, tmp_path)
    assert status == 400
    error = json.loads(raw.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["type"] == "invalid_request_error" and "max_tokens must be 1..10" in error["message"]


def test_curls_expect_continue_and_a_chunked_body_on_a_kept_alive_connection(tmp_path: Path) -> None:
    async def go() -> list[bytes]:
        async with front_door(refuses, tmp_path) as port:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            body = b'{"model": "nope", "prompt": "hi"}'
            w.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
            continued = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 10)
            w.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
            first = await asyncio.wait_for(r.readuntil(b"}}"), 10)
            w.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")  # the same connection, kept alive
            second = await asyncio.wait_for(r.readuntil(b"]}"), 10)
            w.close()
            return [continued, first, second]

    continued, first, second = asyncio.run(go())
    assert continued.startswith(b"HTTP/1.1 100 Continue")
    assert first.startswith(b"HTTP/1.1 404") and b'"code": "model_not_found"' in first
    assert second.startswith(b"HTTP/1.1 200") and b'"id": "m"' in second


async def ready_after_a_while(w: asyncio.StreamWriter) -> None:
    await asyncio.sleep(0.2)  # a Triton busy enough that the client's FIN arrives first
    w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    await w.drain()


def test_a_client_that_half_closes_after_its_request_still_gets_health_and_models(tmp_path: Path) -> None:
    """`printf 'GET /health ...' | nc` ends its side once the request is sent: /health and
    /v1/models are answered all the same (only a generation is cancelled on EOF)."""

    async def ask(port: int, path: str) -> bytes:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"GET %s HTTP/1.0\r\n\r\n" % path.encode())
        await w.drain()
        w.write_eof()
        raw = await asyncio.wait_for(r.read(), 10)
        w.close()
        return raw

    async def go() -> list[bytes]:
        async with front_door(ready_after_a_while, tmp_path) as port:
            return [await ask(port, "/health"), await ask(port, "/v1/models")]

    health, models = asyncio.run(go())
    assert health.startswith(b"HTTP/1.1 200") and health.endswith(b'{"ready": true}'), health
    assert models.startswith(b"HTTP/1.1 200") and b'"id": "m"' in models, models


async def answers_one_token(w: asyncio.StreamWriter) -> None:
    w.write(STREAM_HEAD + sse(ids("a")) + b"0\r\n\r\n")
    await w.drain()


def test_what_benchmark_clients_and_qwen3_users_send_reaches_triton(tmp_path: Path) -> None:
    """inference-perf's and guidellm's ignore_eos, Qwen3's chat_template_kwargs (its thinking
    switch): each reaches the engine, as the end id no token has and as a template variable."""
    thinking_switch = "{%- if enable_thinking is defined and not enable_thinking %}/no_think{%- endif %}"
    seen: list[dict[str, Any]] = []

    async def go() -> tuple[int, bytes]:
        async with front_door(
            answers_one_token, tmp_path, seen=seen, template_suffix=thinking_switch
        ) as port:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                    "ignore_eos": True, "min_tokens": 4, "top_k": 20,
                    "chat_template_kwargs": {"enable_thinking": False}}  # fmt: skip
            return await exchange(port, body, "/v1/chat/completions")

    status, raw = asyncio.run(go())
    assert status == 200, raw
    (generate,) = [b for b in seen if "input_ids" in b]
    assert bytes(generate["input_ids"]).endswith(b"<|im_start|>assistant\n/no_think")
    assert (generate["end_id"], generate["min_tokens"], generate["runtime_top_k"]) == (-1, 4, 20)


async def sends_the_text_so_far(w: asyncio.StreamWriter) -> None:
    texts = ("Hel", "Hello", "Hello, wo", "Hello, world")
    w.write(STREAM_HEAD + b"".join(sse({"text_output": t}) for t in texts) + b"0\r\n\r\n")
    await w.drain()


@pytest.mark.parametrize("stream", [True, False])
def test_the_llmapi_models_text_so_far_is_sent_once(tmp_path: Path, stream: bool) -> None:
    """The pytorch backend's model answers each step with the whole text so far: the client gets
    each new part once, streamed or not."""

    async def go() -> tuple[int, bytes]:
        async with front_door(sends_the_text_so_far, tmp_path, backend="pytorch") as port:
            return await exchange(port, {"model": "m", "prompt": "hi", "max_tokens": 5, "stream": stream})

    status, raw = asyncio.run(go())
    assert status == 200, raw
    if stream:
        text = "".join(json.loads(e)["choices"][0]["text"] for e in events(raw)[:-1])
    else:
        text = json.loads(raw.split(b"\r\n\r\n", 1)[1])["choices"][0]["text"]
    assert text == "Hello, world"


async def ends_on_its_end_token(w: asyncio.StreamWriter) -> None:
    """The llmapi model's last response says why it finished (return_finish_reason)."""
    texts = ("Hel", "Hello", "Hello, wo", "Hello, world")
    body = b"".join(sse({"text_output": t}) for t in texts[:-1])
    w.write(STREAM_HEAD + body + sse({"text_output": texts[-1], "finish_reason": "stop"}) + b"0\r\n\r\n")
    await w.drain()


@pytest.mark.parametrize("stream", [True, False])
def test_the_llmapi_models_finish_reason_is_the_answers(tmp_path: Path, stream: bool) -> None:
    """12 tokens at max_tokens 12 would count as "length"; the model ended on its end token, and
    says so: the client gets "stop"."""
    seen: list[dict[str, Any]] = []

    async def go() -> tuple[int, bytes]:
        async with front_door(ends_on_its_end_token, tmp_path, backend="pytorch", seen=seen) as port:
            return await exchange(port, {"model": "m", "prompt": "hi", "max_tokens": 12, "stream": stream})

    status, raw = asyncio.run(go())
    assert status == 200, raw
    if stream:
        reasons = [json.loads(e)["choices"][0]["finish_reason"] for e in events(raw)[:-1]]
        assert reasons[-1] == "stop" and set(reasons[:-1]) == {None}
    else:
        assert json.loads(raw.split(b"\r\n\r\n", 1)[1])["choices"][0]["finish_reason"] == "stop"
    assert seen[-1]["return_finish_reason"] is True


@pytest.mark.parametrize("stream", [True, False])
def test_x_request_id_is_honoured_and_returned(tmp_path: Path, stream: bool) -> None:
    """A client's X-Request-Id comes back in a header and in the response's id; one that is not a
    short visible token is replaced, never echoed."""
    body = {"model": "m", "prompt": "hi", "max_tokens": 1, "stream": stream}

    async def go(sent: bytes) -> tuple[int, bytes]:
        async with front_door(answers_one_token, tmp_path) as port:
            return await exchange(port, body, headers=sent)

    status, raw = asyncio.run(go(b"X-Request-Id: trace-42\r\n"))
    assert status == 200 and b"\r\nX-Request-Id: trace-42\r\n" in raw.split(b"\r\n\r\n", 1)[0]
    first = json.loads(events(raw)[0]) if stream else json.loads(raw.split(b"\r\n\r\n", 1)[1])
    assert first["id"] == "cmpl-trace-42"
    status, raw = asyncio.run(go(b"X-Request-Id: " + b"x" * 200 + b"\r\n"))
    head = raw.split(b"\r\n\r\n", 1)[0].decode()
    assert status == 200 and "x" * 200 not in head
    assert re.search(r"\r\nX-Request-Id: [0-9a-f]{32}\r\n", head), head
