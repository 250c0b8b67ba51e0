"""Properties of the rollout state machine over random histories (hypothesis): pods getting ready,
time passing, spec changes, user actions, measurements of any outcome, routes that come and go."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llm_operator.api.v1alpha1 import RolloutPhase
from llm_operator.rollout.machine import decide
from llm_operator.rollout.types import Decision, Measurement, Slot, SlotObserved

from tests.unit.rollout.world import World, analysis, spec

METRICS = ["errorRate", "p99Latency"]


@st.composite
def canary_specs(draw: st.DrawFn) -> dict[str, Any]:
    weights = sorted(draw(st.sets(st.integers(1, 100), min_size=1, max_size=4)))
    pauses = [draw(st.one_of(st.none(), st.integers(0, 120))) for _ in weights]
    canary: dict[str, Any] = {
        "steps": [
            {"weight": w} if p is None else {"weight": w, "pauseSeconds": p}
            for w, p in zip(weights, pauses, strict=True)
        ],
        "abortScaleDownDelaySeconds": draw(st.integers(0, 60)),
    }
    if draw(st.booleans()):
        canary |= {"trafficRouting": "gateway-api", "gateway": {"parentRefs": [{"name": "gw"}]}}
    if draw(st.booleans()):
        canary["analysis"] = analysis(
            maxErrorRatePercent=1,
            maxP99LatencyMilliseconds=800,
            failureLimit=draw(st.integers(0, 2)),
            inconclusiveLimit=draw(st.integers(0, 2)),
            consecutiveErrorLimit=draw(st.integers(0, 2)),
        )
    return canary


measurement = st.builds(
    Measurement,
    st.sampled_from(METRICS),
    st.one_of(st.none(), st.sampled_from([0.0, 0.5, 5.0, 300.0, 2000.0])),
    st.sampled_from([0, 5, 100]),
    st.one_of(st.none(), st.none(), st.just("unreachable")),
)

ready = st.tuples(st.just("ready"), st.integers(1, 3))
wait = st.tuples(st.just("wait"), st.integers(1, 90))
op = st.one_of(
    ready,
    wait,
    st.tuples(st.just("decide"), st.none()),
    ready,
    wait,
    st.tuples(st.just("measure"), st.lists(measurement, min_size=1, max_size=2)),
    st.tuples(st.just("measure"), st.just([Measurement(m, 0.1, 100) for m in METRICS])),
    st.tuples(st.just("revision"), st.sampled_from(["r1", "r2", "r3"])),
    st.tuples(st.just("total"), st.integers(0, 5)),
    st.tuples(
        st.just("action"),
        st.sampled_from(["promote", "promote-full", "abort", "retry", "bogus"]).map(lambda a: f"{a}/x"),
    ),
    st.tuples(st.just("route"), st.booleans()),
    st.tuples(st.just("lose"), st.sampled_from(list(Slot))),
)


@dataclass
class Before:
    ready: dict[Slot, int]  # per slot, as observed when decide() was called
    revision: str  # the revision the previous decision was made for
    total: int


def check(w: World, d: Decision, before: Before, action: str | None, canary: dict[str, Any]) -> None:
    r = d.revisions
    assert r.stable is not None and r.stable_slot is not None
    # The stable revision's slot is always rendered: never deleted while it serves.
    assert d.slots[r.stable_slot].revision == r.stable
    assert (r.canary is None) == (r.canary_slot is None) == (r.canary_weight is None)
    if r.canary_slot is not None:
        assert r.canary_slot != r.stable_slot and d.slots[r.canary_slot].revision == r.canary
    assert sum(d.weights.values()) == 100 and min(d.weights.values()) >= 0
    gateway = canary.get("trafficRouting") == "gateway-api"
    weights = [s["weight"] for s in canary["steps"]]
    if gateway and r.canary is not None and r.phase != RolloutPhase.PROMOTING:
        # The route never gives the canary more than its step's weight, nor weight without endpoints.
        assert d.weights["canary"] <= weights[r.canary_step or 0]
        assert (r.canary_weight or 0) <= weights[r.canary_step or 0]
    if d.weights["canary"] > 0:
        assert r.canary_slot is not None and before.ready.get(r.canary_slot, 0) >= 1
    if not gateway and r.canary_slot is not None and r.phase != RolloutPhase.ABORTED:
        # replica-ratio: the stable shrinks only by ready canary replicas.
        counted = min(before.ready.get(r.canary_slot, 0), d.slots[r.canary_slot].replicas)
        assert d.slots[r.stable_slot].replicas + counted >= w.total
    # Something that served still serves, unless the spec itself changed what runs or nothing is wanted.
    if sum(before.ready.values()) > 0 and before.revision == w.revision and w.total > 0:
        assert sum(seen.ready for seen in w.slots.values()) > 0
    assert d.requeue_after is None or d.requeue_after > 0
    for kind, reason, message in d.events:
        assert kind in ("Normal", "Warning") and reason[:1].isupper() and message


def step_timing(old: Any, new: Any, canary: dict[str, Any], action: str | None, w: World) -> None:
    """Without a user action no step ends before its pause; a step without pause never ends."""
    if action is not None or old is None or old.canary is None or old.canary != new.canary:
        return
    moved = (new.canary_step or 0) > (old.canary_step or 0) or (
        new.phase == RolloutPhase.PROMOTING and old.phase != RolloutPhase.PROMOTING
    )
    if not moved:
        return
    assert old.phase == RolloutPhase.PROGRESSING
    pause = canary["steps"][old.canary_step or 0].get("pauseSeconds")
    assert pause is not None
    if old.step_started_at is None:  # started and ended in one call: only a zero pause, no analysis
        assert pause == 0 and "analysis" not in canary
    else:
        assert (w.now - old.step_started_at).total_seconds() >= pause


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(canary=canary_specs(), ops=st.lists(op, max_size=60), total=st.integers(1, 5))
def test_random_histories_keep_the_invariants(
    canary: dict[str, Any], ops: list[tuple[str, Any]], total: int
) -> None:
    w = World(spec(canary), "r1", total)
    w.decide()
    w.ready()
    w.revision = "r2"  # a canary from the start; the history may change the spec again
    last_revision = "r1"
    for name, arg in ops:
        action: str | None = None
        measurements: list[Measurement] | None = None
        if name == "ready":
            w.ready(limit=arg)
        elif name == "wait":
            w.wait(arg)
        elif name == "revision":
            w.revision = arg
        elif name == "total":
            w.total = arg
        elif name == "action":
            action = arg
        elif name == "route":
            w.route_ready = arg
        elif name == "measure":
            measurements = arg
        elif name == "lose" and arg in w.slots:
            seen = w.slots[arg]
            w.slots[arg] = SlotObserved(seen.revision, seen.replicas, 0, seen.exists)
        before = Before({s: o.ready for s, o in w.slots.items()}, last_revision, w.total)
        last_revision, old = w.revision, w.status
        again = decide(
            w.spec, w.revision, w.status, dict(w.slots), w.total, measurements, action, w.now, w.route_ready
        )
        d = w.decide(measurements=measurements, action=action)
        assert d == again  # pure: the same inputs, the same decision
        check(w, d, before, action, canary)
        step_timing(old, d.revisions, canary, action, w)
