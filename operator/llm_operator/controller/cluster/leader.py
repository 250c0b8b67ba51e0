"""One operator process among several replicas: stand by, lead, stop.

kopf starts only once this replica holds the Lease (controller/cluster/lease.py), so a standby has no
watch, no queue and no state to go stale: taking over is a fresh start, the path every restart
takes. Until then it is hot: imports done, configuration read, the API client connected, the
Lease polled every retry period, and its health endpoint answering.

/healthz is served here, standing by and leading alike, by the bounded server of
controller/http_server.py (kopf's own liveness endpoint bounds neither the connections it holds
nor how long an idle one stays): 200 while the event loop runs, which is all kopf's said.

A leader whose renewals fail past the renew deadline, or that finds another holder, has its
writes refused at once (`Kube`'s fence) and stops kopf; the process exits 1, and the kubelet
restarts it as a standby. On SIGTERM kopf stops first, then the Lease is released, so the
standby takes over at its next poll instead of after the lease duration.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from lightkube import AsyncClient

from llm_operator.controller.cluster.lease import ElectionConfig, LeaseElector
from llm_operator.controller.http_server import BoundedServer
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
    health = Health(election)
    server = await BoundedServer({"/healthz": health.route}).start("0.0.0.0", health_port)
    try:
        return await _run(election, operator, health)
    finally:
        server.close()


async def _run(
    election: ElectionConfig | None, operator: Callable[[Term], Awaitable[None]], health: Health
) -> int:
    if election is None:
        LEADER.set(1)
        health.leading = True
        await operator(Term(asyncio.Event()))
        return 0
    elector = LeaseElector(election, AsyncClient())
    await elector.acquire()
    health.leading = True
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


class Health:
    """200 while the process runs: standing by (ready to take over) or leading. Liveness and
    readiness alike: Ready means "running, able to take over", not "leading" (the Lease's holder)."""

    def __init__(self, election: ElectionConfig | None) -> None:
        self.lease = None if election is None else f"{election.namespace}/{election.lease}"
        self.leading = False

    def route(self, headers: Mapping[str, str]) -> tuple[int, str, bytes]:
        body = (
            {} if self.lease is None else {"leaderElection": {"lease": self.lease, "leading": self.leading}}
        )
        return 200, "application/json", json.dumps(body).encode()
