"""Leader election (controller/cluster/lease.py): the Lease records written, expiry on the candidate's own
clock, the fence, and two electors against an in-memory Lease store with optimistic concurrency
and an injected clock (the e2e tier runs the same code against the real API server)."""

from __future__ import annotations

import asyncio
import copy
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import Status
from llm_operator.controller.cluster.kube import Kube, NotLeading
from llm_operator.controller.cluster.lease import (
    Clock,
    ElectionConfig,
    Leadership,
    LeaseElector,
    LeaseRecord,
    Observed,
    claim,
    released,
)
from llm_operator.controller.config import election_from_env

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_first_claim_renewal_and_takeover() -> None:
    first = claim(None, "a", T0, 15)
    assert first == LeaseRecord("a", 15, acquire_time=T0, renew_time=T0, transitions=0)
    later = T0 + timedelta(seconds=2)
    renewed = claim(first, "a", later, 15)
    assert renewed == LeaseRecord("a", 15, acquire_time=T0, renew_time=later, transitions=0)
    taken = claim(renewed, "b", later, 15)
    assert taken == LeaseRecord("b", 15, acquire_time=later, renew_time=later, transitions=1)
    gone = released(taken, later)
    assert gone == LeaseRecord("", 1, acquire_time=later, renew_time=later, transitions=1)
    assert claim(gone, "a", later, 15).transitions == 2, "taking a released Lease is a transition"


def test_spec_round_trip_always_has_micro_time() -> None:
    """The API server rejects a MicroTime without six fractional digits, even at .000000."""
    record = claim(None, "pod-0", T0, 15)
    spec = record.to_spec()
    assert spec == {
        "holderIdentity": "pod-0",
        "leaseDurationSeconds": 15,
        "acquireTime": "2026-01-01T00:00:00.000000Z",
        "renewTime": "2026-01-01T00:00:00.000000Z",
        "leaseTransitions": 0,
    }
    assert LeaseRecord.from_spec(spec) == record
    assert LeaseRecord.from_spec({"leaseDurationSeconds": 15}).holder == ""


def test_expiry_is_judged_on_our_clock_from_when_we_saw_a_change() -> None:
    seen = Observed()
    stale = claim(None, "a", T0 - timedelta(days=1), 15)  # its wall-clock renewTime means nothing
    seen.see(stale, 100.0)
    assert seen.held_by_other("b", 114.9)
    assert not seen.held_by_other("b", 115.0)
    seen.see(stale, 114.0)  # unchanged: the timer keeps running
    assert not seen.held_by_other("b", 115.0)
    seen.see(claim(stale, "a", T0, 15), 115.0)  # renewed: a new lease duration from now
    assert seen.held_by_other("b", 129.0)
    assert not seen.held_by_other("a", 116.0), "our own Lease is never held against us"
    seen.see(released(stale, T0), 130.0)
    assert not seen.held_by_other("b", 130.0), "a released Lease is free at once"


def test_the_fence_closes_at_the_renew_deadline_and_on_loss() -> None:
    now = [0.0]
    fence = Leadership(10, lambda: now[0])
    with pytest.raises(NotLeading):
        fence.check()
    fence.renewed(5.0)
    now[0] = 14.9
    fence.check()
    now[0] = 15.0  # a process paused past its deadline: CLOCK_MONOTONIC ran on meanwhile
    with pytest.raises(NotLeading):
        fence.check()
    fence.renewed(15.0)
    fence.lose()
    assert not fence.leading()


def test_timings_must_nest() -> None:
    ElectionConfig("l", "ns", "a", 15, 10, 2)
    for duration, deadline, retry in [(10, 10, 2), (15, 10, 10), (15, 10, 0)]:
        with pytest.raises(ValueError, match="retryPeriodSeconds < renewDeadlineSeconds"):
            ElectionConfig("l", "ns", "a", duration, deadline, retry)


def test_configuration_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("LLMOP_LEADER_ELECTION", "LLMOP_LEADER_ELECTION_IDENTITY", "LLMOP_LEASE_DURATION_SECONDS",
                "LLMOP_RENEW_DEADLINE_SECONDS", "LLMOP_RETRY_PERIOD_SECONDS"):  # fmt: skip
        monkeypatch.delenv(var, raising=False)
    assert election_from_env() is None, "off unless asked for: `llm-operator run` alone reconciles"
    monkeypatch.setenv("LLMOP_LEADER_ELECTION", "yes")
    with pytest.raises(ValueError, match="true or false"):
        election_from_env()
    monkeypatch.setenv("LLMOP_LEADER_ELECTION", "true")
    monkeypatch.setenv("LLMOP_LEADER_ELECTION_LEASE", "rel-llm-operator")
    monkeypatch.setenv("LLMOP_LEADER_ELECTION_NAMESPACE", "ops")
    monkeypatch.setenv("LLMOP_LEADER_ELECTION_IDENTITY", "rel-llm-operator-7d9f-x2")
    monkeypatch.setenv("LLMOP_LEASE_DURATION_SECONDS", "30")
    assert election_from_env() == ElectionConfig(
        "rel-llm-operator", "ops", "rel-llm-operator-7d9f-x2", 30, 10, 2
    )


async def test_a_refused_write_never_reaches_the_api() -> None:
    def fence() -> None:
        raise NotLeading("not the holder")

    kube = Kube(client=cast(AsyncClient, object()), fence=fence)  # any request would fail otherwise
    child = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "n"}}
    with pytest.raises(NotLeading):
        await kube.apply(child)
    with pytest.raises(NotLeading):
        await kube.patch_status("n", "d", {})


# --- two electors, one Lease ---------------------------------------------------------------------


class Stored:
    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.body)


class LeaseStore:
    """The Lease as the API server keeps it: resourceVersion preconditions, 404 and 409."""

    def __init__(self) -> None:
        self.body: dict[str, Any] | None = None
        self.versions = itertools.count(1)
        self.writes: list[str] = []  # holderIdentity of every write that succeeded

    async def get(self, res: Any, name: str, *, namespace: str) -> Stored:
        if self.body is None:
            raise ApiError(status=Status(code=404, message="not found"))
        return Stored(self.body)

    async def create(self, obj: Any) -> None:
        if self.body is not None:
            raise ApiError(status=Status(code=409, message="already exists"))
        self._store(obj)

    async def replace(self, obj: Any) -> None:
        assert self.body is not None
        if obj.to_dict()["metadata"]["resourceVersion"] != self.body["metadata"]["resourceVersion"]:
            raise ApiError(status=Status(code=409, message="the object has been modified"))
        self._store(obj)

    def _store(self, obj: Any) -> None:
        body = obj.to_dict()
        body["metadata"]["resourceVersion"] = str(next(self.versions))
        self.body = body
        self.writes.append(body["spec"]["holderIdentity"])


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def clock(self) -> Clock:
        return Clock(monotonic=lambda: self.now, wall=lambda: T0 + timedelta(seconds=self.now))


def elector(store: LeaseStore, clock: FakeClock, identity: str) -> LeaseElector:
    config = ElectionConfig("llm-operator", "ops", identity, 15, 10, 2)
    return LeaseElector(config, cast(AsyncClient, store), clock.clock())


async def test_one_holder_a_standby_waits_the_lease_duration_and_a_paused_holder_is_fenced() -> None:
    store, clock = LeaseStore(), FakeClock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    assert await a._attempt() and a.leadership.leading()
    for _ in range(5):  # both poll every retry period: a renews, b waits
        clock.now += 2
        assert await a._attempt()
        assert not await b._attempt()
    paused = clock.now  # a stops (SIGSTOP): no more renewals
    while not await b._attempt():
        clock.now += 2
        assert clock.now - paused < 20, "b never took over"
    assert 15 <= clock.now - paused <= 17, "a lease duration (plus one poll) after the last renewal b saw"
    assert not a.leadership.leading(), "a's fence closed at its renew deadline, before b took over"
    assert store.body is not None and store.body["spec"]["leaseTransitions"] == 1
    # a resumes: it finds b's record and does not take the Lease back while b renews.
    assert not await a._attempt()
    assert store.writes == ["a"] * 6 + ["b"]


async def test_concurrent_candidates_one_wins() -> None:
    store, clock = LeaseStore(), FakeClock()
    candidates = [elector(store, clock, f"c{i}") for i in range(5)]
    won = await asyncio.gather(*(c._attempt() for c in candidates))
    assert sum(won) == 1 and len(store.writes) == 1


async def test_release_hands_over_at_the_next_poll() -> None:
    store, clock = LeaseStore(), FakeClock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    assert await a._attempt()
    assert not await b._attempt()
    await a.release()
    assert not a.leadership.leading()
    clock.now += 2
    assert await b._attempt(), "a released Lease needs no lease duration of waiting"
    await a.release()  # not the holder any more: writes nothing
    assert store.writes == ["a", "", "b"]
