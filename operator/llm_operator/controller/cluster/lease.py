"""Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it.

One replica holds the Lease and reconciles; the others poll it every `retryPeriodSeconds`. Every
write goes through optimistic concurrency (the resourceVersion just read), so two candidates can
never both win. Expiry is judged by the candidate's own monotonic clock: a Lease whose record
has not changed for its `leaseDurationSeconds` since this process last saw it change may be
taken; the holder's wall-clock `renewTime` is informative only (clocks of nodes differ).

The holder counts itself leader only until `renewDeadlineSeconds` after the start of its last
successful renewal (the fence, `Leadership.check`), which is shorter than the lease duration
that others wait: a holder that was paused (SIGSTOP, a stalled node) or cut off from the API
server stops writing before anyone else may start. CLOCK_MONOTONIC keeps counting while a
process is stopped, so the fence is already closed when a paused holder resumes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.generic_resource import create_namespaced_resource

from llm_operator.controller.cluster.kube import NotLeading
from llm_operator.controller.metrics import LEADER

log = logging.getLogger(__name__)

# Generic (dict-valued) rather than lightkube's typed Lease: that one re-serialises its times
# without the fractional part when microseconds are 0, and the API server rejects such a MicroTime.
LeaseResource = create_namespaced_resource("coordination.k8s.io", "v1", "Lease", "leases")


@dataclass(frozen=True)
class ElectionConfig:
    lease: str  # the Lease's name
    namespace: str  # the operator's own namespace
    identity: str  # this replica (its pod name): holderIdentity
    lease_duration_seconds: int = 15
    renew_deadline_seconds: int = 10
    retry_period_seconds: int = 2

    def __post_init__(self) -> None:
        if not 0 < self.retry_period_seconds < self.renew_deadline_seconds < self.lease_duration_seconds:
            raise ValueError(
                "leader election needs 0 < retryPeriodSeconds < renewDeadlineSeconds < "
                f"leaseDurationSeconds; got {self.retry_period_seconds}, {self.renew_deadline_seconds}, "
                f"{self.lease_duration_seconds}"
            )


@dataclass(frozen=True)
class Clock:
    """Injectable time: `monotonic` judges expiry and the fence, `wall` fills the Lease's times."""

    monotonic: Callable[[], float] = time.monotonic
    wall: Callable[[], datetime] = lambda: datetime.now(UTC)


@dataclass(frozen=True)
class LeaseRecord:
    holder: str  # "" once released
    lease_duration_seconds: int
    acquire_time: datetime | None = None
    renew_time: datetime | None = None
    transitions: int = 0

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> LeaseRecord:
        return cls(
            holder=spec.get("holderIdentity") or "",
            lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=_parse(spec.get("acquireTime")),
            renew_time=_parse(spec.get("renewTime")),
            transitions=int(spec.get("leaseTransitions") or 0),
        )

    def to_spec(self) -> dict[str, Any]:
        return {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.lease_duration_seconds,
            "acquireTime": _micro_time(self.acquire_time),
            "renewTime": _micro_time(self.renew_time),
            "leaseTransitions": self.transitions,
        }


def claim(current: LeaseRecord | None, identity: str, now: datetime, duration: int) -> LeaseRecord:
    """The record that makes `identity` the holder: a renewal keeps acquireTime and the count of
    transitions, a takeover (or taking a released Lease) starts a new term."""
    if current is not None and current.holder == identity:
        return replace(current, lease_duration_seconds=duration, renew_time=now)
    transitions = current.transitions + 1 if current is not None else 0
    return LeaseRecord(identity, duration, acquire_time=now, renew_time=now, transitions=transitions)


def released(current: LeaseRecord, now: datetime) -> LeaseRecord:
    """Given up on shutdown: no holder, so a candidate takes it at its next poll."""
    return LeaseRecord("", 1, acquire_time=now, renew_time=now, transitions=current.transitions)


class Observed:
    """The last record seen and when (monotonic) it last changed."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.since = 0.0

    def see(self, record: LeaseRecord | None, now: float) -> None:
        if record != self.record:
            self.record, self.since = record, now

    def held_by_other(self, identity: str, now: float) -> bool:
        """Someone else holds it and has renewed within its lease duration, as far as we saw."""
        r = self.record
        if r is None or r.holder in ("", identity):
            return False
        return now < self.since + r.lease_duration_seconds


class Leadership:
    """The fence: leading until `renew_deadline` after the start of the last successful renewal."""

    def __init__(self, renew_deadline: float, monotonic: Callable[[], float]) -> None:
        self.renew_deadline = renew_deadline
        self._monotonic = monotonic
        self.renewed_at: float | None = None

    def renewed(self, attempt_started: float) -> None:
        self.renewed_at = attempt_started

    def lose(self) -> None:
        self.renewed_at = None

    def leading(self) -> bool:
        return self.renewed_at is not None and self._monotonic() < self.renewed_at + self.renew_deadline

    def check(self) -> None:
        """Raise NotLeading unless a write may be sent now (every write of the operator asks)."""
        if not self.leading():
            raise NotLeading("this replica does not hold the leader Lease: refusing to write")


class LeaseElector:
    def __init__(self, config: ElectionConfig, client: AsyncClient, clock: Clock | None = None) -> None:
        self.config = config
        self.client = client
        self.clock = clock or Clock()
        self.observed = Observed()
        self.leadership = Leadership(config.renew_deadline_seconds, self.clock.monotonic)

    async def acquire(self) -> None:
        """Wait, polling every retry period, until this replica holds the Lease."""
        c = self.config
        log.info("leader election: waiting for Lease %s/%s as %s", c.namespace, c.lease, c.identity)
        holder = None
        while not await self._attempt():
            r = self.observed.record
            if r is not None and r.holder != holder:
                holder = r.holder
                log.info("leader election: Lease %s/%s held by %s", c.namespace, c.lease, holder or "nobody")
            await asyncio.sleep(c.retry_period_seconds)
        LEADER.set(1)
        log.info("leader election: %s now holds Lease %s/%s", c.identity, c.namespace, c.lease)

    async def hold(self) -> None:
        """Renew every retry period; return once leadership is lost (the fence is closed first)."""
        c = self.config
        while True:
            await asyncio.sleep(c.retry_period_seconds)
            if await self._attempt() or (self.leadership.leading() and self._holder_is_me()):
                continue
            self.leadership.lose()
            LEADER.set(0)
            r = self.observed.record
            log.error(
                "leader election: lost Lease %s/%s (holder now: %s); this replica stops reconciling",
                c.namespace, c.lease, (r.holder if r else "") or "nobody",
            )  # fmt: skip
            return

    async def release(self) -> None:
        """On shutdown, after the last write: hand the Lease over at once instead of letting it expire."""
        if not self.leadership.leading():
            return
        self.leadership.lose()
        LEADER.set(0)
        try:
            lease = await self._get()
            record = _record(lease) if lease is not None else None
            if lease is None or record is None or record.holder != self.config.identity:
                return
            await self._replace(released(record, self.clock.wall()), lease)
            log.info("leader election: released Lease %s/%s", self.config.namespace, self.config.lease)
        except Exception as e:  # any failure: the Lease then expires by itself
            log.warning("leader election: could not release the Lease (it expires by itself): %r", e)

    def _holder_is_me(self) -> bool:
        r = self.observed.record
        return r is not None and r.holder == self.config.identity

    async def _attempt(self) -> bool:
        """One try to acquire or renew; False when someone else holds it or the API failed."""
        try:
            async with asyncio.timeout(self.config.renew_deadline_seconds):
                return await self._try_acquire_or_renew()
        except Exception as e:  # API error, transport error, timeout: this attempt failed
            log.warning("leader election: Lease request failed: %r", e)
            return False

    async def _try_acquire_or_renew(self) -> bool:
        c, started = self.config, self.clock.monotonic()
        lease = await self._get()
        current = _record(lease) if lease is not None else None
        self.observed.see(current, started)
        if self.observed.held_by_other(c.identity, started):
            return False
        if current is not None and current.holder != c.identity and self.leadership.renewed_at is not None:
            return False  # taken over meanwhile: a lost term is never resumed
        mine = claim(current, c.identity, self.clock.wall(), c.lease_duration_seconds)
        try:
            if lease is None:
                await self._create(mine)
            else:
                await self._replace(mine, lease)
        except ApiError as e:
            if e.status.code == 409:  # another candidate wrote first
                return False
            raise
        self.observed.see(mine, started)
        self.leadership.renewed(started)
        return True

    async def _get(self) -> dict[str, Any] | None:
        lease: Any  # lightkube's generic resource: to_dict() is untyped
        try:
            lease = await self.client.get(LeaseResource, self.config.lease, namespace=self.config.namespace)
        except ApiError as e:
            if e.status.code == 404:
                return None
            raise
        result: dict[str, Any] = lease.to_dict()
        return result

    async def _create(self, record: LeaseRecord) -> None:
        meta = {"name": self.config.lease, "namespace": self.config.namespace}
        await self.client.create(LeaseResource.from_dict({"metadata": meta, "spec": record.to_spec()}))

    async def _replace(self, record: LeaseRecord, read: dict[str, Any]) -> None:
        """PUT with the resourceVersion that was read: a write by anyone meanwhile makes it 409."""
        meta = {k: read["metadata"][k] for k in ("name", "namespace", "resourceVersion")}
        await self.client.replace(LeaseResource.from_dict({"metadata": meta, "spec": record.to_spec()}))


def _record(lease: dict[str, Any]) -> LeaseRecord | None:
    spec = lease.get("spec")
    return LeaseRecord.from_spec(spec) if spec else None


def _micro_time(t: datetime | None) -> str | None:
    """metav1.MicroTime: always six fractional digits (the API server rejects fewer)."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ") if t is not None else None


def _parse(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


__all__ = ["Clock", "ElectionConfig", "Leadership", "LeaseElector", "LeaseRecord", "NotLeading", "claim"]
