"""A de-duplicating work queue of LLMDeployment keys, with delayed re-adds for backoff.

A key is queued at most once and never processed by two workers at the same time: a key added
while it is being processed runs once more afterwards. That is what lets every trigger just add
the key and the reconcile stay level-based.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from llm_operator.controller.metrics import QUEUE_DEPTH

Key = tuple[str, str]  # namespace, name


class WorkQueue:
    def __init__(self, process: Callable[[Key], Awaitable[None]]) -> None:
        self._process = process
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._queued: set[Key] = set()
        self._active: set[Key] = set()
        self._again: set[Key] = set()
        self._timers: dict[Key, asyncio.Task[None]] = {}  # referenced, so none is collected early

    def add(self, key: Key) -> None:
        if key in self._active:
            self._again.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)
        QUEUE_DEPTH.set(len(self._queued))

    def add_after(self, key: Key, delay: float) -> None:
        """Add the key once `delay` has passed; a later call for the same key replaces it."""
        previous = self._timers.pop(key, None)
        if previous is not None:
            previous.cancel()

        async def later() -> None:
            await asyncio.sleep(delay)
            self._timers.pop(key, None)
            self.add(key)

        self._timers[key] = asyncio.get_running_loop().create_task(later())

    def forget(self, key: Key) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def __len__(self) -> int:
        return len(self._queued)

    async def worker(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            self._active.add(key)
            QUEUE_DEPTH.set(len(self._queued))
            try:
                await self._process(key)
            finally:
                self._active.discard(key)
                if key in self._again:
                    self._again.discard(key)
                    self.add(key)
