"""A multi-node group's stall as its leader sees it (frontdoor/stall.py): requests in flight and no
response from Triton for stallTimeoutSeconds. The watch's rule, the front door's count of what is
in flight before a Triton stand-in on a real socket, and the whole path in real processes: the
launcher, the real front door and a Triton port that takes a request and never answers; the pod
ends with the front door's status and its words."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import socketserver
import threading
import time
from collections.abc import Callable

from llm_operator.contract import STALLED_PREFIX
from llm_operator.frontdoor.stall import EXIT_STALLED, StallWatch
from llm_operator.frontdoor.upstream import Upstream

from tests.unit.test_frontdoor_process import leader  # noqa: F401 (a fixture)
from tests.unit.test_frontdoor_server import STREAM_HEAD, fake_triton, ids, sse
from tests.unit.test_launcher import Pod


def test_in_flight_with_no_response_for_the_timeout_is_a_stall() -> None:
    watch = StallWatch(10)
    assert watch.stalled(1000) is None  # idle: nothing to wait for
    watch.began(100)
    assert watch.stalled(109.9) is None
    why = watch.stalled(110)
    assert why is not None and why.startswith(STALLED_PREFIX)
    assert "no response from Triton for 10 s while 1 request(s) were in flight" in why


def test_any_response_restarts_the_clock_and_a_new_request_does_not() -> None:
    watch = StallWatch(10)
    watch.began(100)
    watch.answered(108)  # a token of the first request
    assert watch.stalled(117) is None
    watch.began(115)  # another arrives while the first waits: the first's wait goes on
    assert watch.stalled(118) is not None
    watch.ended()
    watch.ended()
    assert watch.in_flight == 0 and watch.stalled(500) is None
    watch.began(600)  # busy again after a quiet spell: counted from now
    assert watch.stalled(605) is None and watch.stalled(610) is not None


def test_a_timeout_of_zero_watches_nothing() -> None:
    watch = StallWatch(0)
    watch.began(0)
    assert watch.stalled(10**6) is None


def test_the_front_door_counts_what_is_in_flight_and_each_response() -> None:
    """Before a Triton stand-in: one token, then silence (a stalled world) until released."""
    release = asyncio.Event()

    async def one_token_then_silence(w: asyncio.StreamWriter) -> None:
        w.write(STREAM_HEAD + sse(ids("a")))
        await w.drain()
        await release.wait()
        w.write(sse(ids("b")) + b"0\r\n\r\n")
        await w.drain()

    async def scenario() -> None:
        triton = await fake_triton(one_token_then_silence, [])
        upstream = Upstream("127.0.0.1", triton.sockets[0].getsockname()[1], stall_timeout=0.3)
        answers = upstream.generate("tensorrt_llm", {"text_input": "x"}, stream=True)
        first = await anext(answers)
        assert first.ids == (ord("a"),) and upstream.watch.in_flight == 1
        start = time.monotonic()
        assert upstream.watch.stalled(start) is None
        waiting = asyncio.ensure_future(anext(answers))
        await asyncio.sleep(0.4)
        assert (upstream.watch.stalled(time.monotonic()) or "").startswith(STALLED_PREFIX)
        release.set()
        assert (await waiting).ids == (ord("b"),)
        assert upstream.watch.stalled(time.monotonic()) is None  # answered again
        with contextlib.suppress(StopAsyncIteration):
            await anext(answers)
        assert upstream.watch.in_flight == 0
        triton.close()

    asyncio.run(scenario())


class SilentTriton(socketserver.StreamRequestHandler):
    """Triton of a stalled world: its model's config says decoupled, a generation never answers."""

    def handle(self) -> None:
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            head += self.rfile.read(1) or b"\r\n\r\n"
        if head.startswith(b"GET ") and b"/config " in head:
            body = json.dumps({"model_transaction_policy": {"decoupled": True}}).encode()
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        else:
            time.sleep(60)


def test_a_stalled_world_ends_the_leader_with_the_front_doors_words(
    leader: Callable[..., tuple[Pod, int]],  # noqa: F811
) -> None:
    """Triton's port takes the request and never answers: the front door exits EXIT_STALLED after
    the timeout, the launcher stops Triton and exits with that status, and the termination message
    (the operator's GroupRecreated words) says the group stalled."""
    silent = socketserver.ThreadingTCPServer(("127.0.0.1", 0), SilentTriton)
    silent.daemon_threads = True
    threading.Thread(target=silent.serve_forever, daemon=True).start()
    try:
        pod, api = leader(LLMOP_STALL_TIMEOUT_SECONDS="1", LLMOP_HTTP_PORT=str(silent.server_address[1]))

        def ask() -> None:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", api)) as c:
                body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 4}).encode()
                c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                          % (len(body), body))  # fmt: skip
                c.settimeout(30)
                c.recv(1)  # until the front door goes away

        asker = threading.Thread(target=ask, daemon=True)
        start = time.monotonic()
        asker.start()
        assert pod.proc.wait(timeout=30) == EXIT_STALLED
        assert 1 <= time.monotonic() - start < 10
        assert (pod.dir / "rank0.term").exists()  # Triton was stopped with it
        said = (pod.dir / "termination-log").read_text().splitlines()
        assert said[0].endswith(f"llm_operator.frontdoor exited (status {EXIT_STALLED}): stopping the server")
        assert said[-1].startswith(f"{STALLED_PREFIX}no response from Triton for "), said
        asker.join(timeout=10)
    finally:
        silent.shutdown()
        silent.server_close()


def test_an_idle_group_is_never_taken_for_stalled(leader: Callable[..., tuple[Pod, int]]) -> None:  # noqa: F811
    pod, _ = leader(LLMOP_STALL_TIMEOUT_SECONDS="1")
    time.sleep(2.5)
    assert pod.proc.poll() is None
    pod.proc.send_signal(signal.SIGTERM)
    assert pod.proc.wait(timeout=20) == 0
    assert not os.path.exists(pod.dir / "termination-log")
