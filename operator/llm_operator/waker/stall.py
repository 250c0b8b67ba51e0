"""Whether a wake-up can succeed: while the waker holds a request, it reads its LLMDeployment every
few seconds, and when no replica is ready and the status says none can start (Stalled, or Degraded:
an image that cannot be pulled, a crash loop), the held requests end at once with a 503 naming the
status's reason, instead of waiting out the hold (docs/autoscaling.md, "Progress while held").

Only the deployment's own condition reason and message (the operator's words) are passed on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

# How often the deployment is read while a request is held: a refusal comes within this (and one
# read) of the status saying so. One GET of one object per period, only while requests wait.
PERIOD_S = 5.0
BLOCKING = ("Stalled", "Degraded")  # conditions that, True at zero ready replicas, end the wake-up


def refusal(obj: dict[str, Any]) -> str | None:
    """The refusal's message for an LLMDeployment as read, None while a wake-up may still succeed."""
    status = obj.get("status") or {}
    if status.get("readyReplicas") or 0:
        return None
    conditions = {c.get("type"): c for c in status.get("conditions") or [] if isinstance(c, dict)}
    for kind in BLOCKING:
        c = conditions.get(kind) or {}
        if c.get("status") == "True":
            reason, message = str(c.get("reason") or kind), str(c.get("message") or "")
            return f"the deployment cannot start a replica: {reason}" + (f": {message}" if message else "")
    return None


Reader = Callable[[], Awaitable[dict[str, Any]]]


class Watch:
    """The deployment's refusal, read every `period_s` while at least one request is held; a state
    read within the last period is used as is by a request that arrives."""

    def __init__(self, read: Reader, period_s: float = PERIOD_S, log: Callable[[str], None] = print) -> None:
        self.read, self.period_s, self.log = read, period_s, log
        self.held = 0
        self.message: str | None = None
        self.bad = asyncio.Event()  # set while the last read says the wake-up cannot succeed
        self.read_at: float | None = None
        self.failing = False  # the last read failed (logged once per run of failures)
        self.poller: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        self.held += 1
        if self.poller is None or self.poller.done():
            if not self._fresh():
                self._set(None)  # read while nothing was held, too long ago to answer by
            self.poller = asyncio.create_task(self._poll())
        try:
            yield
        finally:
            self.held -= 1

    async def refused(self) -> str:
        """Returns the refusal's message once the deployment says the wake-up cannot succeed."""
        while True:
            await self.bad.wait()
            if self.message is not None:
                return self.message

    def _fresh(self) -> bool:
        return self.read_at is not None and asyncio.get_running_loop().time() - self.read_at < self.period_s

    async def _poll(self) -> None:
        if self._fresh():
            assert self.read_at is not None  # that state stands until the period is over
            await asyncio.sleep(self.read_at + self.period_s - asyncio.get_running_loop().time())
        while self.held:
            await self._read_once()
            await asyncio.sleep(self.period_s)

    async def _read_once(self) -> None:
        try:
            obj = await self.read()
        except Exception as e:  # the API server unreachable, RBAC: the hold goes on
            if not self.failing:
                self.log(f"cannot read the deployment's status ({type(e).__name__}); requests stay held")
            self.failing = True
            self._set(None)
            return
        self.failing = False
        message = refusal(obj)
        if message != self.message:
            self.log(message or "the deployment's status allows a wake-up again")
        self._set(message)
        self.read_at = asyncio.get_running_loop().time()

    def _set(self, message: str | None) -> None:
        self.message = message
        if message is None:
            self.bad.clear()
        else:
            self.bad.set()


def kube_reader(name: str) -> tuple[Reader, str]:
    """A reader of the LLMDeployment `name` in the pod's own namespace (lightkube's in-cluster
    config: the ServiceAccount token the router's Role lets get that one object), and the namespace.
    Imported here only: the waker without a deployment to read needs h11 alone."""
    from lightkube import AsyncClient
    from lightkube.generic_resource import create_namespaced_resource

    from llm_operator.api import v1alpha1 as api

    resource = create_namespaced_resource(api.GROUP, api.VERSION, api.KIND, api.PLURAL)
    client = AsyncClient()

    async def read() -> dict[str, Any]:
        obj = await client.get(resource, name)
        return dict(obj.to_dict())  # type: ignore[no-untyped-call]

    return read, client.namespace
