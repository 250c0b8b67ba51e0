"""A wake-up that cannot succeed (llm_operator/waker/stall.py): the LLMDeployment's status read as a
refusal or none, and the waker ending held requests with it on real sockets, in front of the
stand-in Envoy (tests/unit/waker_fixtures.py): an unstreamed request gets a 503 with Retry-After, a
streamed one already sent comments one SSE error event, both at once once the status says so; their
Envoy requests are dropped; a status that allows the wake-up again lets the next request through."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from llm_operator.waker.stall import Watch, refusal

from tests.openai_errors import openai_error
from tests.unit.waker_fixtures import EVENTS, dechunk, exchange, request_bytes, running

STREAMED = {"model": "tiny-llama", "prompt": "Once upon a time", "max_tokens": 2, "stream": True}
UNSTREAMED = {**STREAMED, "stream": False}
PERIOD = 0.2
PULL = 'tiny-llama-zero-0: ImagePullBackOff: Back-off pulling image "nowhere/none:1"'


def _status(ready: int | None, **conditions: tuple[str, str, str]) -> dict[str, Any]:
    conds = [{"type": t, "status": s, "reason": r, "message": m} for t, (s, r, m) in conditions.items()]
    status: dict[str, Any] = {"conditions": conds}
    if ready is not None:
        status["readyReplicas"] = ready
    return {"metadata": {"name": "tiny-llama-zero"}, "status": status}


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (_status(0, Degraded=("True", "PodsFailing", PULL)),
         f"the deployment cannot start a replica: PodsFailing: {PULL}"),
        (_status(None, Stalled=("True", "MissingObject", 'secret "hf" not found')),
         'the deployment cannot start a replica: MissingObject: secret "hf" not found'),
        (_status(0, Stalled=("True", "EngineBuildFailed", "")),
         "the deployment cannot start a replica: EngineBuildFailed"),
        # A replica serves: the request goes to it, whatever else the status says.
        (_status(1, Degraded=("True", "PodsFailing", PULL)), None),
        # Still starting, or scaled to zero and waking: the hold goes on.
        (_status(0, Degraded=("False", "AsExpected", ""), Stalled=("False", "WaitingForReplicas", "")), None),
        ({"metadata": {}}, None),
    ],
)  # fmt: skip
def test_a_status_saying_no_replica_can_start_is_a_refusal(obj: dict[str, Any], expected: str | None) -> None:
    assert refusal(obj) == expected


class Status:
    """The deployment as the API server would answer, changed by the test; reads counted."""

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj, self.reads = obj, 0

    async def read(self) -> dict[str, Any]:
        self.reads += 1
        return self.obj


BAD = _status(0, Degraded=("True", "PodsFailing", PULL))
GOOD = _status(0, Degraded=("False", "AsExpected", ""))


def _watch(status: Status) -> Watch:
    return Watch(status.read, period_s=PERIOD, log=lambda line: None)


def test_a_held_unstreamed_request_gets_a_503_naming_the_reason_at_once() -> None:
    status = Status(GOOD)
    with running(0.5, 0.3, watch=_watch(status)) as r:
        status.obj = BAD
        started = time.monotonic()
        answer = exchange(r.port, request_bytes(UNSTREAMED, "json:10"), until=b"}}")
        took = time.monotonic() - started
        deadline = time.monotonic() + 3
        while not r.seen.gone and time.monotonic() < deadline:
            time.sleep(0.05)
        gone = r.seen.gone
    code, error = openai_error(answer.raw)
    assert (code, error["type"], error["code"]) == (503, "server_error", "model_not_ready"), error
    assert error["message"] == f"the deployment cannot start a replica: PodsFailing: {PULL}", error
    assert b"\r\nRetry-After: 5\r\n" in answer.raw, answer.raw
    assert took < PERIOD + 1.0, took  # not the 10 s Envoy would have held it
    assert gone == 1  # its Envoy request was dropped


def test_a_streamed_request_sent_comments_gets_one_error_event_then_the_next_is_served() -> None:
    status = Status(GOOD)
    with running(0.5, 0.3, watch=_watch(status)) as r:
        # Bad from 1.2 s on: after the first comment (0.5 s), well before Envoy's answer (10 s).
        threading.Timer(1.2, lambda: setattr(status, "obj", BAD)).start()
        started = time.monotonic()
        answer = exchange(r.port, request_bytes(STREAMED, "stream:10"))
        took = time.monotonic() - started
        status.obj = GOOD
        time.sleep(PERIOD * 2)  # the refusal read while the request was held goes stale
        served = exchange(r.port, request_bytes(STREAMED, "stream:0"))
    head, _, body = answer.raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK"), head
    events = [e for e in dechunk(body).split(b"\n\n") if e and e != b": waking"]
    assert len(events) == 2 and events[1] == b"data: [DONE]", events
    error = json.loads(events[0].removeprefix(b"data: "))["error"]
    assert (error["code"], error["type"]) == ("model_not_ready", "server_error"), error
    assert error["message"].endswith(f"PodsFailing: {PULL}"), error
    assert 1.2 <= took < 1.2 + PERIOD + 1.0, took
    assert dechunk(served.raw.partition(b"\r\n\r\n")[2]) == b"".join(EVENTS)


def test_the_status_is_read_only_while_a_request_is_held() -> None:
    status = Status(GOOD)
    with running(0.5, 0.3, watch=_watch(status)) as r:
        time.sleep(PERIOD * 3)
        idle_reads = status.reads
        exchange(r.port, request_bytes(STREAMED, "stream:1"))
        held_reads = status.reads
        time.sleep(PERIOD * 3)
        after = status.reads
        # Not a generation request: never read.
        exchange(r.port, request_bytes(None, "json:0.5", path="/v1/models", method="GET"), until=b"}")
    assert idle_reads == 0
    assert 1 / PERIOD - 2 <= held_reads <= 1 / PERIOD + 2, held_reads  # one at once, then each period
    assert after == held_reads


def test_a_status_that_cannot_be_read_leaves_the_hold_as_it_is() -> None:
    async def failing() -> dict[str, Any]:
        raise ConnectionError("no API server")

    with running(0.5, 0.3, watch=Watch(failing, period_s=PERIOD, log=lambda line: None)) as r:
        answer = exchange(r.port, request_bytes(UNSTREAMED, "json:1"), until=b"}")
    assert answer.raw.startswith(b"HTTP/1.1 200 OK"), answer.raw
