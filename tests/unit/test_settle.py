"""Reconciling starts once every watch has listed, and what exists then is frozen out of the
garbage collector's full passes (they walked all of it every ten seconds or so: 130-250 ms at
1,000 deployments)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest
from llm_operator.controller import handlers


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


class Worker:
    def __init__(self) -> None:
        self.started = 0

    async def worker(self) -> None:
        self.started += 1


async def test_workers_wait_for_every_list_then_what_exists_is_frozen() -> None:
    listed, settled, reconciler = [asyncio.Event(), asyncio.Event()], asyncio.Event(), Worker()
    settle = asyncio.create_task(handlers.settle_once_listed(listed, settled))
    workers = [asyncio.create_task(handlers.work_once_settled(reconciler, settled)) for _ in range(3)]  # type: ignore[arg-type]
    kept = {"a long-lived cache": ["entry"]}

    listed[0].set()
    await asyncio.sleep(0.01)
    assert (reconciler.started, gc.get_freeze_count()) == (0, 0), "one watch has not listed yet"

    listed[1].set()
    await asyncio.gather(settle, *workers)
    assert reconciler.started == 3
    assert gc.get_freeze_count() > 0
    assert gc.is_tracked(kept) and not any(o is kept for o in gc.get_objects()), "frozen: no pass walks it"


async def test_a_watch_that_never_lists_delays_the_workers_only_so_long(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(handlers, "LIST_TIMEOUT_SECONDS", 0.05)
    settled, reconciler = asyncio.Event(), Worker()
    await handlers.settle_once_listed([asyncio.Event()], settled)
    await handlers.work_once_settled(reconciler, settled)  # type: ignore[arg-type]
    assert reconciler.started == 1 and gc.get_freeze_count() > 0
    assert "some watches have not listed within" in caplog.text
