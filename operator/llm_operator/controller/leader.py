"""One operator process among several replicas: stand by, lead, stop.

kopf starts only once this replica holds the Lease (controller/lease.py), so a standby has no
watch, no queue and no state to go stale: taking over is a fresh start, the path every restart
takes. Until then it is hot: imports done, configuration read, the API client connected, the
Lease polled every retry period, and its health endpoint answering on the port kopf's takes over.

A leader whose renewals fail past the renew deadline, or that finds another holder, has its
writes refused at once (`Kube`'s fence) and stops kopf; the process exits 1, and the kubelet
restarts it as a standby. On SIGTERM kopf stops first, then the Lease is released, so the
standby takes over at its next poll instead of after the lease duration.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from lightkube import AsyncClient

from llm_operator.controller.lease import ElectionConfig, LeaseElector
from llm_operator.controller.metrics import LEADER

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Term:
    """What the operator gets for the time it leads."""

    stop: asyncio.Event  # set when the Lease is lost: kopf's stop flag
    fence: Callable[[], None] | None = None  # raises NotLeading once writes must stop
    step_down: Callable[[], Awaitable[None]] | None = None  # after the last write: release the Lease


async def run(
    election: ElectionConfig | None, health_port: int, operator: Callable[[Term], Awaitable[None]]
) -> int:
    """Run `operator` while this replica leads; returns the process's exit code."""
    if election is None:
        LEADER.set(1)
        await operator(Term(asyncio.Event()))
        return 0
    elector = LeaseElector(election, AsyncClient())
    standby = await _serve_standby_health(health_port, election)
    try:
        await elector.acquire()
    finally:
        standby.close()
        await standby.wait_closed()
    stop = asyncio.Event()
    holding = asyncio.create_task(elector.hold())
    holding.add_done_callback(lambda _: stop.set())

    async def step_down() -> None:
        """Called once the operator's writers have stopped (kopf's cleanup), seconds before kopf
        itself is done: the standby can start at once."""
        if not holding.done():
            holding.cancel()
            await asyncio.gather(holding, return_exceptions=True)
            await elector.release()

    try:
        await operator(Term(stop, elector.leadership.check, step_down))
    finally:
        lost = holding.done() and not holding.cancelled()
        if not lost:
            await step_down()
    return 1 if lost else 0


async def _serve_standby_health(port: int, election: ElectionConfig) -> asyncio.Server:
    """200 on any path while standing by: the process is up and ready to take over (liveness and
    readiness). kopf serves the same port once this replica leads."""
    lease = f"{election.namespace}/{election.lease}"
    body = json.dumps({"leaderElection": {"lease": lease, "leading": False}})
    response = (
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}"
    ).encode()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(5):
                await reader.readuntil(b"\r\n\r\n")
                writer.write(response)
                await writer.drain()
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # a probe that hung up or sent garbage gets nothing
        finally:
            writer.close()

    return await asyncio.start_server(answer, "0.0.0.0", port, reuse_address=True)
