"""Scenarios of the rollout state machine over a simulated cluster (world.py): every call goes
through the status it wrote, as JSON, so each step is also what a restarted operator resumes."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from llm_operator.api.v1alpha1 import AnalysisPhase, PausedReason, RevisionsStatus, RolloutPhase
from llm_operator.rollout.types import Measurement, Slot, SlotObserved, SlotTarget

from tests.unit.rollout.world import World, analysis, good, spec

GW: dict[str, Any] = {"trafficRouting": "gateway-api", "gateway": {"parentRefs": [{"name": "gw"}]}}
STEPS = [{"weight": 25, "pauseSeconds": 60}, {"weight": 50, "pauseSeconds": 60}]


def canary_world(total: int = 4, **canary: Any) -> World:
    w = World(spec({"steps": STEPS, **canary}), "r1", total)
    w.decide()
    w.ready()
    w.decide()
    w.revision = "r2"
    return w


def test_first_sight_the_current_revision_is_stable_in_slot_a() -> None:
    w = World(spec({"steps": STEPS}), "r1", 3)
    d = w.decide()
    assert d.slots == {Slot.A: SlotTarget("r1", 3)}
    assert (d.revisions.stable, d.revisions.stable_slot, d.revisions.phase) == (
        "r1",
        Slot.A,
        RolloutPhase.STABLE,
    )
    assert d.revisions.canary is None and d.revisions.canary_weight is None
    assert d.events == [] and d.requeue_after is None and not d.measure


def test_rolling_strategy_renders_every_revision_into_the_stable_slot() -> None:
    w = World(spec(strategy="rolling"), "r1", 2)
    w.decide()
    w.revision = "r2"
    d = w.decide()
    assert d.slots == {Slot.A: SlotTarget("r2", 2)}
    assert d.revisions.stable == "r2" and d.events == []


def test_a_good_canary_walks_every_step_and_is_promoted_in_its_own_slot() -> None:
    w = canary_world()
    d = w.decide()
    assert w.reasons()[-1] == "CanaryStarted"
    assert d.slots == {Slot.A: SlotTarget("r1", 4), Slot.B: SlotTarget("r2", 1)}
    assert (d.revisions.canary_weight, d.revisions.step_started_at) == (0, None)

    w.ready()
    d = w.decide()  # the canary replica is ready: the stable shrinks by it, the timer starts
    assert d.slots == {Slot.A: SlotTarget("r1", 3), Slot.B: SlotTarget("r2", 1)}
    assert (d.revisions.canary_weight, d.revisions.step_started_at, d.requeue_after) == (25, w.now, 60)
    assert "25% for 60 s, until 20:01:00Z" in (d.revisions.message or "")
    d = w.decide()  # the stable's pod is gone
    w.wait(30)
    assert w.decide().revisions == d.revisions  # nothing changed, status neither: no write, no wake-up

    w.wait(29)
    assert w.decide().revisions.canary_step == 0
    w.wait(1)
    d = w.decide()
    assert (d.revisions.canary_step, d.revisions.step_started_at) == (1, None)
    assert d.slots[Slot.A] == SlotTarget("r1", 3)  # not shrunk before the second canary is ready
    w.ready()
    d = w.decide()
    assert d.slots == {Slot.A: SlotTarget("r1", 2), Slot.B: SlotTarget("r2", 2)}
    assert d.revisions.canary_weight == 50

    w.wait(60)
    d = w.decide()
    assert d.revisions.phase == RolloutPhase.PROMOTING
    assert d.slots == {Slot.A: SlotTarget("r1", 2), Slot.B: SlotTarget("r2", 4)}
    w.ready(limit=1)
    assert w.decide().slots[Slot.A] == SlotTarget("r1", 1)
    w.ready()
    d = w.decide()
    assert d.slots == {Slot.B: SlotTarget("r2", 4)}
    assert (d.revisions.stable, d.revisions.stable_slot, d.revisions.canary) == ("r2", Slot.B, None)
    assert d.revisions.phase == RolloutPhase.STABLE
    assert w.reasons() == [
        "CanaryStarted",
        "CanaryStepStarted",
        "CanaryStepCompleted",
        "CanaryStepStarted",
        "CanaryStepCompleted",
        "CanaryPromoting",
        "CanaryPromoted",
    ]
    # The next canary goes into slot a.
    w.revision = "r3"
    assert w.decide().revisions.canary_slot == Slot.A


def test_analysis_gates_each_step_on_a_successful_window_of_every_metric() -> None:
    w = canary_world(
        analysis=analysis(maxErrorRatePercent=1, maxP99LatencyMilliseconds=800, initialDelaySeconds=30)
    )
    w.decide()
    w.ready()
    d = w.decide()
    assert d.revisions.analysis is not None
    assert d.revisions.analysis.next_measurement_at is not None
    assert (d.revisions.analysis.next_measurement_at - w.now).total_seconds() == 90  # delay + one window
    assert not d.measure and d.requeue_after == 60
    w.wait(60)
    d = w.decide()
    assert d.revisions.canary_step == 0 and "waiting for errorRate, p99Latency" in (d.revisions.message or "")
    assert d.requeue_after == 30 and not d.measure
    w.wait(30)
    d = w.decide()
    assert d.measure and d.revisions.canary_step == 0
    d = w.decide(measurements=good("errorRate", "p99Latency"))
    assert d.revisions.canary_step == 1  # the step advanced on its first successful windows
    assert w.reasons()[-2:] == ["AnalysisSuccessful", "CanaryStepCompleted"]
    assert d.revisions.analysis is not None
    assert [m.successful for m in d.revisions.analysis.metrics] == [1, 1]
    w.ready()
    w.decide()
    w.wait(30)
    d = w.decide()
    assert not d.measure and d.requeue_after == 30  # the next window is due 60 s after the last one
    w.wait(30)
    assert w.decide().measure
    d = w.decide(measurements=good("errorRate", "p99Latency"))
    assert d.revisions.phase == RolloutPhase.PROMOTING
    assert d.revisions.analysis is not None
    assert [m.successful for m in d.revisions.analysis.metrics] == [2, 2]


def test_measurements_that_are_not_due_are_not_counted() -> None:
    w = canary_world(analysis=analysis(maxErrorRatePercent=1))
    w.settle()
    w.wait(60)
    assert w.decide().measure
    w.decide(measurements=good("errorRate"))
    w.decide(measurements=good("errorRate"))
    d = w.decide()
    assert d.revisions.analysis is not None and d.revisions.analysis.metrics[0].successful == 1
    assert not d.measure and d.requeue_after == 60


def test_a_failed_window_aborts_names_the_metric_and_stays_aborted() -> None:
    w = canary_world(analysis=analysis(maxTimeToFirstTokenMilliseconds=1000))
    w.settle()
    w.wait(60)
    assert w.decide().measure
    d = w.decide(measurements=[Measurement("timeToFirstToken", 1840.0, 120)])
    r = d.revisions
    assert r.phase == RolloutPhase.ABORTED and r.aborted_at == w.now
    assert r.abort_reason == "canary p99 TTFT 1,840 ms > budget 1,000 ms in 1 of 1 windows"
    assert r.analysis is not None and r.analysis.phase == AnalysisPhase.FAILED
    # replica-ratio: no traffic means no canary pod in the client Service, at once.
    assert d.slots == {Slot.A: SlotTarget("r1", 4), Slot.B: SlotTarget("r2", 0)}
    assert (r.canary_weight, r.canary) == (0, "r2")
    kind, reason, message = d.events[-1]
    assert (kind, reason) == ("Warning", "RolloutAborted") and "1,840 ms" in message
    assert d.events[-2][:2] == ("Warning", "AnalysisFailed")
    w.wait(3600)
    d = w.settle()
    assert d.revisions.phase == RolloutPhase.ABORTED and not d.measure and d.requeue_after is None
    assert "retry" in (d.revisions.message or "")


def test_prometheus_unreachable_is_an_error_past_the_consecutive_limit_never_a_pass() -> None:
    w = canary_world(analysis=analysis(maxErrorRatePercent=1, consecutiveErrorLimit=1))
    w.settle()
    down = [Measurement("errorRate", None, 0, "Prometheus at http://prometheus:9090 unreachable")]
    for _ in range(2):
        w.wait(60)
        assert w.decide().measure
        d = w.decide(measurements=down)
        assert d.revisions.canary_step == 0
    assert d.revisions.phase == RolloutPhase.ABORTED
    assert "could not be measured 2 times in a row" in (d.revisions.abort_reason or "")


def test_no_traffic_is_inconclusive_pauses_and_is_never_promoted() -> None:
    w = canary_world(analysis=analysis(maxErrorRatePercent=1))
    w.settle()
    w.wait(60)
    w.decide()
    d = w.decide(measurements=[Measurement("errorRate", 0.0, 0)])
    r = d.revisions
    assert (r.phase, r.paused_reason) == (RolloutPhase.PAUSED, PausedReason.INCONCLUSIVE)
    assert d.events[-1][:2] == ("Warning", "CanaryInconclusive")
    w.wait(3600)
    d = w.settle()
    assert (d.revisions.phase, d.revisions.canary_step, d.measure) == (RolloutPhase.PAUSED, 0, False)
    # A person decides: promote resumes with a new analysis run at the next step.
    d = w.decide(action="promote")
    assert (d.revisions.phase, d.revisions.canary_step, d.revisions.last_action) == (
        RolloutPhase.PROGRESSING,
        1,
        "promote",
    )
    assert d.revisions.analysis is not None and d.revisions.analysis.phase == AnalysisPhase.RUNNING
    assert d.revisions.analysis.metrics[0].inconclusive == 0


def test_a_new_spec_mid_canary_restarts_at_step_0_in_the_same_slot() -> None:
    w = canary_world()
    w.settle()
    w.wait(60)
    w.settle()
    assert w.status is not None and w.status.canary_step == 1
    w.revision = "r3"
    d = w.decide()
    assert (d.revisions.canary, d.revisions.canary_slot, d.revisions.canary_step) == ("r3", Slot.B, 0)
    assert d.revisions.step_started_at is None
    assert d.slots == {Slot.A: SlotTarget("r1", 4), Slot.B: SlotTarget("r3", 1)}  # r3's pods not ready yet
    assert w.reasons()[-1] == "CanaryRestarted"


def test_a_spec_equal_to_stable_rolls_back_at_once() -> None:
    w = canary_world()
    w.settle()
    w.revision = "r1"
    d = w.decide()
    assert d.slots == {Slot.A: SlotTarget("r1", 4)}
    assert (d.revisions.phase, d.revisions.canary, d.revisions.canary_weight) == (
        RolloutPhase.STABLE,
        None,
        None,
    )
    assert w.reasons()[-1] == "CanaryRolledBack"


def test_a_slot_leaving_the_rollout_bridges_while_the_stable_has_no_ready_replica() -> None:
    w = canary_world()
    w.settle()
    w.slots[Slot.A] = SlotObserved("r1", 3, 0, True)  # the stable's pods were lost
    w.revision = "r1"
    d = w.decide()
    assert d.revisions.canary is None
    assert d.slots == {Slot.A: SlotTarget("r1", 4), Slot.B: SlotTarget("r2", 1)}
    w.ready(limit=1)
    assert w.decide().slots == {Slot.A: SlotTarget("r1", 4)}


def test_promote_ends_the_step_and_promote_full_skips_to_promotion() -> None:
    w = canary_world()
    w.settle()
    d = w.decide(action="promote/1")
    assert (d.revisions.canary_step, d.revisions.last_action) == (1, "promote/1")
    assert w.decide(action="promote/1").revisions.canary_step == 1  # handled once
    d = w.decide(action="promote-full")
    assert d.revisions.phase == RolloutPhase.PROMOTING
    assert d.slots[Slot.B] == SlotTarget("r2", 4)


def test_abort_and_retry_by_the_user() -> None:
    w = canary_world()
    w.settle()
    d = w.decide(action="abort")
    assert d.revisions.phase == RolloutPhase.ABORTED
    assert d.revisions.abort_reason == "aborted by the user (abort)"
    assert w.decide(action="promote/x").events[0][:2] == ("Warning", "RolloutActionIgnored")
    d = w.decide(action="retry")
    assert (d.revisions.phase, d.revisions.canary_step, d.revisions.abort_reason) == (
        RolloutPhase.PROGRESSING,
        0,
        None,
    )
    assert d.slots[Slot.B] == SlotTarget("r2", 1)
    assert w.reasons()[-1] == "CanaryRetried"


def test_an_unknown_action_is_told_once() -> None:
    w = canary_world()
    w.settle()
    d = w.decide(action="promoet")
    assert d.events == [("Warning", "UnknownRolloutAction", d.events[0][2])]
    assert "use promote, promote-full, abort or retry" in d.events[0][2]
    assert w.decide(action="promoet").events == []


def test_a_step_without_pause_waits_until_promoted() -> None:
    w = World(spec({"steps": [{"weight": 50}]}), "r1", 2)
    w.settle()
    w.revision = "r2"
    w.settle()
    w.wait(86400)
    d = w.settle()
    assert (d.revisions.phase, d.revisions.paused_reason) == (
        RolloutPhase.PAUSED,
        PausedReason.UNTIL_PROMOTED,
    )
    assert d.requeue_after is None
    d = w.decide(action="promote")
    assert d.revisions.phase == RolloutPhase.PROMOTING


def test_gateway_api_keeps_the_stable_full_and_swaps_after_the_route_carried_everything() -> None:
    w = canary_world(total=4, **GW)
    d = w.decide()
    assert d.slots == {Slot.A: SlotTarget("r1", 4), Slot.B: SlotTarget("r2", 1)}
    assert d.weights == {"stable": 100, "canary": 0}  # no ready canary endpoint, no weight
    w.ready()
    d = w.decide()
    assert d.weights == {"stable": 75, "canary": 25} and d.revisions.canary_weight == 25
    assert d.slots[Slot.A] == SlotTarget("r1", 4)
    w.decide(action="promote-full")
    w.ready()
    d = w.decide()
    assert d.weights == {"stable": 0, "canary": 100} and d.revisions.phase == RolloutPhase.PROMOTING
    d = w.decide()  # the route carried all traffic to the canary: roles swap
    assert d.weights == {"stable": 100, "canary": 0}
    assert (d.revisions.stable, d.revisions.stable_slot, d.revisions.canary) == ("r2", Slot.B, None)
    # The replaced slot keeps its pods for scaleDownDelaySeconds (default 30): a gateway that has
    # not loaded the new route yet still sends traffic there.
    assert d.slots == {Slot.B: SlotTarget("r2", 4), Slot.A: SlotTarget("r1", 4)}
    assert d.revisions.scale_down_at == w.now + timedelta(seconds=30) and d.requeue_after == 30
    assert "removed in 30 s" in d.events[-1][2] and "removed at " in (d.revisions.message or "")
    w.wait(29)
    assert Slot.A in w.decide().slots
    w.wait(1)
    d = w.decide()
    assert d.slots == {Slot.B: SlotTarget("r2", 4)} and d.revisions.scale_down_at is None
    assert d.requeue_after is None and w.decide().revisions == d.revisions


def test_a_new_canary_during_the_scale_down_delay_takes_the_replaced_slot() -> None:
    w = canary_world(total=2, scaleDownDelaySeconds=60, **GW)
    w.decide(action="promote-full")
    w.settle()
    assert w.status is not None and w.status.stable == "r2" and w.status.scale_down_at is not None
    w.revision = "r3"
    d = w.decide()
    assert (d.revisions.canary, d.revisions.canary_slot, d.revisions.scale_down_at) == ("r3", Slot.A, None)
    assert d.slots == {Slot.B: SlotTarget("r2", 2), Slot.A: SlotTarget("r3", 1)}


def test_replica_ratio_removes_the_replaced_slot_at_promotion() -> None:
    w = canary_world(total=2, scaleDownDelaySeconds=60)
    w.decide(action="promote-full")
    w.settle()
    assert w.status is not None and w.status.stable == "r2" and w.status.scale_down_at is None
    assert w.decide().slots == {Slot.B: SlotTarget("r2", 2)}


def test_gateway_route_not_accepted_holds_the_step_timer() -> None:
    w = canary_world(**GW)
    w.route_ready = False
    w.settle()
    assert w.status is not None and w.status.step_started_at is None and w.status.canary_weight == 0
    assert "waiting for the Gateway to accept the HTTPRoute" in (w.status.message or "")
    w.route_ready = True
    assert w.decide().revisions.step_started_at == w.now


def test_gateway_abort_takes_the_weight_at_once_and_the_pods_after_the_delay() -> None:
    w = canary_world(abortScaleDownDelaySeconds=30, **GW)
    w.settle()
    d = w.decide(action="abort")
    assert d.weights == {"stable": 100, "canary": 0}
    assert d.slots == {Slot.A: SlotTarget("r1", 4), Slot.B: SlotTarget("r2", 1)}
    assert d.requeue_after == 30 and "removed in 30 s" in d.events[-1][2]
    w.wait(30)
    assert w.decide().slots[Slot.B] == SlotTarget("r2", 0)


def test_switching_to_rolling_mid_canary_cancels_it() -> None:
    w = canary_world()
    w.settle()
    w.spec = spec(strategy="rolling")
    d = w.decide()
    assert w.reasons()[-1] == "CanaryCancelled"
    # Slot a rolls to r2; the canary's ready r2 replica bridges until one of slot a's is ready.
    assert d.slots == {Slot.A: SlotTarget("r2", 4), Slot.B: SlotTarget("r2", 1)}
    w.ready(limit=1)
    assert w.decide().slots == {Slot.A: SlotTarget("r2", 4)}


def test_an_action_without_a_canary_is_ignored_with_a_warning() -> None:
    w = World(spec({"steps": STEPS}), "r1", 1)
    d = w.decide(action="promote")
    assert d.events[0][:2] == ("Warning", "RolloutActionIgnored")


def test_a_restarted_operator_resumes_at_the_same_step_with_the_same_timer() -> None:
    w = canary_world()
    w.settle()
    w.wait(60)
    w.settle()
    w.wait(20)
    w.decide()
    assert w.status is not None
    stored = w.status.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert stored["canaryStep"] == 1 and stored["stepStartedAt"] == "2026-11-23T20:01:00Z"
    # A new operator process: nothing but the stored status and what it observes.
    fresh = World(
        w.spec, "r2", 4, now=w.now, status=RevisionsStatus.model_validate(stored), slots=dict(w.slots)
    )
    d = fresh.decide()
    assert (d.revisions.canary_step, d.revisions.step_started_at, d.requeue_after) == (
        1,
        w.status.step_started_at,
        40,
    )
    assert d.events == [] and d.slots == {Slot.A: SlotTarget("r1", 2), Slot.B: SlotTarget("r2", 2)}


def test_an_aborted_canary_scaled_down_is_told_and_time_without_zone_is_utc() -> None:
    w = canary_world(**GW)
    w.settle()
    w.decide(action="abort")
    w.now = w.now.replace(tzinfo=None) + timedelta(seconds=30)
    d = w.decide()
    assert d.slots[Slot.B] == SlotTarget("r2", 0)
    assert d.events[-1][:2] == ("Normal", "CanaryScaledDown")
    assert w.decide().events == []


def test_the_analysis_is_successful_once_the_last_step_passed() -> None:
    w = canary_world(analysis=analysis(maxErrorRatePercent=1))
    w.decide()
    w.decide(action="promote")  # to the last step
    w.settle()
    w.wait(60)
    assert w.decide().measure
    d = w.decide(measurements=good("errorRate"))
    assert d.revisions.phase == RolloutPhase.PROMOTING and not d.measure
    assert d.revisions.analysis is not None and d.revisions.analysis.phase == AnalysisPhase.SUCCESSFUL
    w.wait(600)
    assert not w.decide().measure  # promoting measures no more


def test_gateway_a_last_step_of_100_promotes_in_the_pass_that_ends_it() -> None:
    """The route carried all traffic to the canary through the step: the pass that ends it swaps
    the roles. The route does not change, so no gateway answer would wake another pass."""
    w = canary_world(total=2, steps=[{"weight": 100, "pauseSeconds": 60}], **GW)
    w.decide()
    w.ready()
    d = w.decide()
    assert d.weights == {"stable": 0, "canary": 100} and d.revisions.step_started_at == w.now
    w.wait(60)
    d = w.decide()
    assert (d.revisions.phase, d.revisions.stable, d.revisions.canary) == (RolloutPhase.STABLE, "r2", None)
    reasons = [reason for _, reason, _ in d.events]
    assert reasons == ["CanaryStepCompleted", "CanaryPromoting", "CanaryPromoted"]
