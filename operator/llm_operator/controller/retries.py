"""A reconcile that failed: retried with backoff, reported in status after a few failures in a
row, and forgotten once the deployment is gone."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from lightkube import ApiError

from llm_operator.controller.cluster.kube import KubeApi
from llm_operator.controller.cluster.queue import Key, WorkQueue
from llm_operator.plan.types import PlanningError

log = logging.getLogger(__name__)

# Consecutive failed reconciles (about 3.5 s of backoff) before the error goes into status.
REPORT_AFTER_FAILURES = 4
MAX_BACKOFF_SECONDS = 60.0
Report = Callable[[dict[str, Any], PlanningError], Awaitable[None]]


class Retries:
    def __init__(self, kube: KubeApi, queue: WorkQueue, report: Report) -> None:
        self.kube, self.queue, self.report = kube, queue, report
        self.failures: dict[Key, int] = {}  # consecutive failed reconciles

    def succeeded(self, key: Key) -> None:
        self.failures.pop(key, None)

    async def gone(self, key: Key) -> bool:
        """After a 404: whether the deployment itself is gone. Its DELETED event may never come (a
        watch that lists again after a gap reports no deletion)."""
        try:
            return await self.kube.get_deployment(*key) is None
        except ApiError:
            return False

    async def failed(self, key: Key, why: str) -> None:
        """Retry with backoff; once it has failed REPORT_AFTER_FAILURES times in a row, say so in
        status (Stalled, the error, an Event) rather than retry silently. Nothing running is touched;
        the next successful pass writes the normal status back."""
        attempt = self.failures[key] = self.failures.get(key, 0) + 1
        delay = min(MAX_BACKOFF_SECONDS, 0.5 * 2 ** (attempt - 1))
        log.warning("retrying %s/%s in %.1f s: %s", *key, delay, why)
        if attempt >= REPORT_AFTER_FAILURES:
            try:
                body = await self.kube.get_deployment(*key)
                if body is not None and not body["metadata"].get("deletionTimestamp"):
                    await self.report(
                        body, PlanningError("ReconcileFailed", f"{why} (attempt {attempt}, retrying)")
                    )
            except ApiError as e:  # a 404: deleted meanwhile, and its DELETED event forgets it
                if e.status.code != 404:
                    log.warning("cannot report the failure of %s/%s: %s", *key, e.status.message)
            except Exception:  # the API is what fails: the retry below is all that is left
                log.exception("cannot report the failure of %s/%s", *key)
        self.queue.add_after(key, delay)
