"""What the waker tells KEDA (push.py): the generation requests it holds now (sent to Envoy, no
answer head yet), and whether the deployment is active. Pure asyncio: the exchanges count into it
(exchange.py) without importing gRPC, and so does the operator's renderer (CAPACITY_KEY)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

# The external-push trigger's metadata key for the requests one replica takes (the wake trigger's
# target, render/scale_to_zero.py): the HPA metric's target.
CAPACITY_KEY = "requestsPerReplica"
# Inactive is pushed once nothing has been held this long: a warm deployment's steady traffic then
# pushes no more than one activation each QUIET_S (KEDA only acts on true: inactivity is read at its
# poll, and idling takes idleSeconds, 30 s at least).
QUIET_S = 2.0


class Activity:
    """Generation requests held now (sent to Envoy, no answer head yet), and whether KEDA is told
    the deployment is active: true from the first held request, false QUIET_S after the last."""

    def __init__(self, quiet_s: float = QUIET_S) -> None:
        self.quiet_s = quiet_s
        self.held = 0
        self.active = False
        self.closing = False  # at SIGTERM: the streams end (KEDA reconnects to the next router)
        self._changed = asyncio.Event()
        self._idle: asyncio.TimerHandle | None = None

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        self.held += 1
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        self._set(True)
        try:
            yield
        finally:
            self.held -= 1
            if not self.held:
                self._idle = asyncio.get_running_loop().call_later(self.quiet_s, self._set, False)

    def close(self) -> None:
        self.closing = True
        self._notify()

    def _set(self, active: bool) -> None:
        if not active:
            self._idle = None
        if active != self.active:
            self.active = active
            self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def changes(self) -> AsyncIterator[bool]:
        """The state now, then each change, until close()."""
        sent: bool | None = None
        while not self.closing:
            changed = self._changed
            if self.active != sent:
                sent = self.active
                yield sent
                continue
            await changed.wait()
