"""An optional API (KEDA, the Gateway API) is watched while its CRD is Established: installed after
the operator started, removed, installed again, with no restart."""

from __future__ import annotations

import asyncio
from typing import Any

from llm_operator.controller.handlers import OptionalApi


def crd(established: str | None) -> dict[str, Any]:
    conditions = [] if established is None else [{"type": "Established", "status": established}]
    return {"metadata": {"name": "scaledobjects.keda.sh"}, "status": {"conditions": conditions}}


async def test_its_watches_run_while_the_crd_is_established() -> None:
    started: list[asyncio.Task[None]] = []

    def start() -> list[asyncio.Task[None]]:
        started.append(asyncio.create_task(asyncio.sleep(3600)))
        return [started[-1]]

    api = OptionalApi(start, [])
    await api.crd_event("ADDED", crd(None))  # created, not yet served
    await api.crd_event("MODIFIED", crd("False"))
    assert started == []
    await api.crd_event("MODIFIED", crd("True"))
    await api.crd_event("MODIFIED", crd("True"))  # once
    assert len(started) == 1 and not started[0].done()

    await api.crd_event("DELETED", crd("True"))
    await asyncio.sleep(0)
    assert started[0].cancelled()
    await api.crd_event("ADDED", crd("True"))  # installed again
    assert len(started) == 2 and not started[1].done()
    started[1].cancel()


async def test_watches_running_since_start_are_stopped_when_the_api_goes() -> None:
    running = asyncio.create_task(asyncio.sleep(3600))
    api = OptionalApi(lambda: [], [running])
    await api.crd_event("ADDED", crd("True"))  # the list at start: already watched
    assert not running.done()
    await api.crd_event("DELETED", crd("True"))
    await asyncio.sleep(0)
    assert running.cancelled()
