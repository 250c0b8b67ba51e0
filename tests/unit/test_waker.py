"""The waker (llm_operator/waker/) on real sockets, in front of a stand-in for the router's Envoy
(tests/unit/waker_fixtures.py): a streamed request whose answer is late gets `: waking` comments at
the interval until the first event; a warm answer, an unstreamed one and a late one of another
route pass unchanged and silent; a refusal after the comments becomes one SSE error event that
openai-python raises as APIError; the client's bounds hold."""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from tests.openai_errors import openai_error
from tests.unit.waker_fixtures import (
    EVENTS,
    HOLD_503,
    JSON_ANSWER,
    dechunk,
    exchange,
    request_bytes,
    running,
)

STREAMED = {"model": "tiny-llama", "prompt": "Once upon a time", "max_tokens": 2, "stream": True}
UNSTREAMED = {**STREAMED, "stream": False}
FIRST_WAIT, INTERVAL = 0.5, 0.3


def _split(raw: bytes) -> tuple[bytes, bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return head, body


def test_a_late_streamed_answer_gets_comments_at_the_interval_before_its_first_event() -> None:
    with running(FIRST_WAIT, INTERVAL) as r:
        answer = exchange(r.port, request_bytes(STREAMED, "stream:2"))
    head, body = _split(answer.raw)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n"), head
    assert b"Content-Type: text/event-stream" in head and b"Cache-Control: no-cache" in head, head
    content = dechunk(body)
    comments = content.count(b": waking\n\n")
    # Comments at 0.5 s, then every 0.3 s until the head at 2 s: 0.5, 0.8, 1.1, 1.4, 1.7.
    assert 4 <= comments <= 6, content
    assert content == b": waking\n\n" * comments + b"".join(EVENTS), content
    first_comment = answer.first_at(b": waking")
    assert FIRST_WAIT - 0.05 <= first_comment < FIRST_WAIT + 0.4, first_comment
    assert answer.first_at(b"data: ") >= 2.0
    # The interval between comments: none is sent while an event can be.
    times = [at for at, data in answer.reads if b": waking" in data]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(INTERVAL - 0.1 <= g <= INTERVAL + 0.25 for g in gaps), gaps


def test_a_warm_streamed_answer_passes_unchanged_without_a_comment() -> None:
    raw = request_bytes(STREAMED, "stream:0")
    with running(FIRST_WAIT, INTERVAL) as r:
        direct = exchange(r.envoy_port, raw)
        through = exchange(r.port, raw)
        sent = r.seen.requests
    (head, body), (direct_head, direct_body) = _split(through.raw), _split(direct.raw)
    assert b": waking" not in through.raw
    assert dechunk(body) == dechunk(direct_body) == b"".join(EVENTS)
    # The same head, field for field (case and order), Envoy's X-Request-Id included; only the
    # Date of each answer differs.
    assert _fields(head) == _fields(direct_head), (head, direct_head)
    # The request went on unchanged: the same fields (Host, X-Fake, ...) and body.
    assert sent[0][1:] == sent[1][1:], sent


def _fields(head: bytes) -> list[bytes]:
    return [line for line in head.split(b"\r\n") if not line.lower().startswith(b"date:")]


def test_a_json_answer_passes_byte_for_byte() -> None:
    raw = request_bytes(UNSTREAMED, "json:0")
    with running(FIRST_WAIT, INTERVAL) as r:
        direct = exchange(r.envoy_port, raw, until=JSON_ANSWER)
        through = exchange(r.port, raw, until=JSON_ANSWER)
    assert _fields(_split(through.raw)[0]) == _fields(_split(direct.raw)[0])
    assert _split(through.raw)[1] == _split(direct.raw)[1] == JSON_ANSWER


@pytest.mark.parametrize(
    ("body", "path", "method"),
    [(UNSTREAMED, "/v1/completions", "POST"), (None, "/v1/models", "GET"), (STREAMED, "/health", "POST")],
    ids=["unstreamed", "another-route", "stream-on-another-route"],
)
def test_other_late_answers_wait_silently(body: dict[str, object] | None, path: str, method: str) -> None:
    with running(FIRST_WAIT, INTERVAL) as r:
        answer = exchange(r.port, request_bytes(body, "json:1.5", path, method), until=JSON_ANSWER)
    assert answer.reads[0][0] >= 1.5, answer.reads  # no byte before Envoy's answer
    head, content = _split(answer.raw)
    assert head.startswith(b"HTTP/1.1 200 OK") and content == JSON_ANSWER


def test_the_hold_refusal_after_comments_is_one_sse_error_event() -> None:
    with running(FIRST_WAIT, INTERVAL) as r:
        answer = exchange(r.port, request_bytes(STREAMED, "hold:1"))
    head, body = _split(answer.raw)
    assert head.startswith(b"HTTP/1.1 200 OK"), head  # the status went out with the first comment
    events = [e for e in dechunk(body).split(b"\n\n") if e and not e.startswith(b": waking")]
    assert events[0] == b"data: " + _compact(HOLD_503), events
    assert events[1:] == [b"data: [DONE]"], events


def _compact(obj: object) -> bytes:
    return json.dumps(obj).encode()


def test_a_plain_text_reply_becomes_an_openai_error_event() -> None:
    with running(FIRST_WAIT, INTERVAL) as r:
        answer = exchange(r.port, request_bytes(STREAMED, "plain:1"))
    first = dechunk(_split(answer.raw)[1]).split(b"\n\n")
    error = next(e for e in first if e.startswith(b"data: {"))
    parsed = json.loads(error.removeprefix(b"data: "))["error"]
    assert parsed["type"] == "server_error" and "504" in parsed["message"], parsed
    assert "upstream request timeout" in parsed["message"], parsed


def test_openai_python_raises_api_error_on_the_error_event() -> None:
    """openai-python's Stream raises APIError on a data event with an `error` key (its
    _streaming.py, legacy stream mode: the default), carrying the error object's code and type."""
    with running(FIRST_WAIT, INTERVAL) as r:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{r.port}/v1", api_key="none", max_retries=0)
        stream = client.completions.create(model="tiny-llama", prompt="Once", max_tokens=2, stream=True,
                                           extra_headers={"x-fake": "hold:1"})  # fmt: skip
        with pytest.raises(openai.APIError) as raised:
            for _ in stream:
                pass
        # The same client reads a held answer that comes, comments and all.
        held = client.completions.create(model="tiny-llama", prompt="Once", max_tokens=2, stream=True,
                                         extra_headers={"x-fake": "stream:1"})  # fmt: skip
        texts = [c.choices[0].text for c in held]
    assert raised.value.code == "model_not_ready" and raised.value.type == "server_error", raised.value
    assert "hold of 3 s" in raised.value.message
    assert texts == ["Once", " upon"], texts


def test_a_client_that_leaves_a_held_request_ends_it_at_envoy() -> None:
    with running(FIRST_WAIT, INTERVAL) as r:
        with socket.create_connection(("127.0.0.1", r.port), timeout=5) as sock:
            sock.sendall(request_bytes(STREAMED, "stream:5"))
            assert b": waking" in sock.recv(65536)
        deadline = time.monotonic() + 3
        while not r.seen.gone and time.monotonic() < deadline:
            time.sleep(0.05)
        assert r.seen.gone == 1


def test_connections_to_envoy_are_reused() -> None:
    with running(FIRST_WAIT, INTERVAL) as r:
        for _ in range(3):
            exchange(r.port, request_bytes(UNSTREAMED, "json:0"), until=JSON_ANSWER)
        assert r.seen.connections == 1


def test_a_body_over_the_inspected_cap_is_passed_on_without_comments() -> None:
    """Past the front door's body cap nothing is kept to read `stream` from: the body is forwarded
    whole (the front door refuses it), and the answer waits silently."""
    big = {**STREAMED, "prompt": "x" * 4096}
    with running(FIRST_WAIT, INTERVAL, max_body_bytes=1024) as r:
        answer = exchange(r.port, request_bytes(big, "json:1"), until=JSON_ANSWER)
        assert len(r.seen.requests[0][3]) > 4096
    assert b": waking" not in answer.raw and answer.reads[0][0] >= 1.0


def test_past_the_connection_cap_a_client_gets_a_503() -> None:
    with (
        running(FIRST_WAIT, INTERVAL, max_connections=1) as r,
        socket.create_connection(("127.0.0.1", r.port)),
    ):
        time.sleep(0.2)
        answer = exchange(r.port, b"", until=b"}}")
    status, error = openai_error(answer.raw)
    assert (status, error["code"]) == (503, "too_many_connections"), error


def test_a_slow_head_gets_a_408_and_http_1_0_a_426() -> None:
    with running(FIRST_WAIT, INTERVAL, head_timeout_s=0.5) as r:
        slow = exchange(r.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n", until=b"}}")
        old = exchange(r.port, b"GET /v1/models HTTP/1.0\r\n\r\n", until=b"}}")
        assert not r.seen.requests
    assert openai_error(slow.raw)[0] == 408
    assert openai_error(old.raw)[0] == 426


def test_a_body_that_stops_coming_gets_a_408() -> None:
    """The body is forwarded as it comes (Envoy has its head and first half at once); one that stops
    coming is refused after the body timeout, and Envoy's connection is dropped with it."""
    raw = request_bytes(STREAMED, "json:0")
    with running(FIRST_WAIT, INTERVAL, body_timeout_s=1.0) as r:
        answer = exchange(r.port, raw[: len(raw) - 10], until=b"}}")
        deadline = time.monotonic() + 2
        while not r.seen.gone and time.monotonic() < deadline:
            time.sleep(0.02)
        assert r.seen.gone == 1  # the waker dropped its connection to Envoy mid-body
        assert not r.seen.requests  # the stand-in never got a whole request
    status, error = openai_error(answer.raw)
    assert status == 408 and "body did not arrive within 1 s" in error["message"], error
    assert answer.reads[0][0] >= 1.0


def test_http2_prior_knowledge_is_passed_through_as_bytes() -> None:
    """h2c with prior knowledge, which Envoy's listener speaks, reaches Envoy unchanged (the
    stand-in answers HTTP/1.1's 400 to it, which comes back as it is)."""
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    with running(FIRST_WAIT, INTERVAL) as r:
        direct = exchange(r.envoy_port, preface, until=b"\r\n\r\n")
        through = exchange(r.port, preface, until=b"\r\n\r\n")
    assert through.raw.split(b"\r\n")[0] == direct.raw.split(b"\r\n")[0], (through.raw, direct.raw)


def test_the_process_serves_and_ends_at_sigterm_closing_idle_connections() -> None:
    """`python3 -m llm_operator.waker`, as the router pod runs it: it answers, and SIGTERM ends it at
    once although a client keeps its connection open between requests."""
    with running() as r:
        port = _free_port()
        args = [
            sys.executable,
            "-m",
            "llm_operator.waker",
            "--port",
            str(port),
            "--envoy-port",
            str(r.envoy_port),
        ]
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "operator")}
        proc = subprocess.Popen(args, env=env, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
                    break
                except OSError:
                    assert proc.poll() is None and time.monotonic() < deadline, "the waker did not start"
                    time.sleep(0.1)
            with sock:
                sock.sendall(request_bytes(UNSTREAMED, "json:0"))
                got = b""
                while JSON_ANSWER not in got:
                    got += sock.recv(65536)
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(5) == 0
                assert sock.recv(65536) == b""  # closed by the waker
        finally:
            proc.kill()
            _, err = proc.communicate()
    assert "llm-operator-waker: on port" in err, err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_waker_needs_only_the_standard_library_h11_and_grpc() -> None:
    """It runs from the operator's image, which has h11, grpcio (and its typing_extensions) and
    protobuf (KEDA's external-push scaler, waker/push.py) but not the front door's tokenizers or
    jinja2: importing it loads nothing else (the front door's HTTP layer imports its tokenizer
    module, which loads the tokenizers library only where a tokenizer is loaded). Reading the
    deployment's status (--deployment, waker/stall.py) loads lightkube, which the image has, then."""
    check = (
        "import sys\n"
        "allowed = set(sys.stdlib_module_names) | {'h11', 'llm_operator', 'grpc', 'google',"
        " 'typing_extensions'}\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] not in allowed:\n"
        "            raise ImportError(f'the waker imported {name}')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import llm_operator.waker.__main__, llm_operator.waker.server\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "operator")}
    run = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr


def test_an_unreachable_envoy_is_a_503() -> None:
    with running(FIRST_WAIT, INTERVAL) as r:
        r.waker.pool.port = _free_port()  # nothing listens there
        answer = exchange(r.port, request_bytes(STREAMED, "stream:0"), until=b"}}")
    status, error = openai_error(answer.raw)
    assert (status, error["code"]) == (503, "router_unavailable"), error
