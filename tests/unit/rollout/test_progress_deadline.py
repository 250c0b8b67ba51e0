"""rollout.canary.progressDeadlineSeconds: a canary whose replicas do not become ready is aborted,
and the abort says which pods and why; time spent before its workloads exist does not count."""

from __future__ import annotations

from typing import Any

from llm_operator.api.v1alpha1 import RolloutPhase
from llm_operator.rollout import words
from llm_operator.rollout.types import Slot, SlotTarget

from tests.unit.rollout.world import World, spec

STEPS = [{"weight": 25, "pauseSeconds": 60}, {"weight": 50, "pauseSeconds": 60}]
CRASHING = "tiny-b-0: CrashLoopBackOff: exited 1 (Error): CUDA error: out of memory"


def canary_world(**canary: Any) -> World:
    w = World(spec({"steps": STEPS, "progressDeadlineSeconds": 600, **canary}), "r1", 4)
    w.decide()
    w.ready()
    w.decide()
    w.revision = "r2"
    assert w.decide().revisions.waiting_since is None, "no canary workload yet: nothing waits"
    return w


def test_a_canary_not_ready_by_the_deadline_is_aborted_in_the_words_of_its_pods() -> None:
    w = canary_world()
    d = w.decide()  # the canary's StatefulSet exists now: the clock starts
    assert d.revisions.waiting_since == w.now and d.requeue_after == 600
    assert "aborted at 20:10:00Z unless ready" in (d.revisions.message or "")
    w.problems = {Slot.B: (CRASHING,)}
    w.wait(599)
    d = w.decide()
    assert d.revisions.phase == RolloutPhase.PROGRESSING and d.requeue_after == 1
    w.wait(1)
    d = w.decide()
    assert d.revisions.phase == RolloutPhase.ABORTED and d.revisions.aborted_at == w.now
    assert d.revisions.abort_reason == (
        "step 1 of 2 (25%): 0 of 1 canary replicas ready after 600 s "
        f"(rollout.canary.progressDeadlineSeconds): {CRASHING}"
    )
    assert d.slots == {Slot.A: SlotTarget("r1", 4), Slot.B: SlotTarget("r2", 0)}, "its pods go at once"
    kind, reason, message = w.events[-1]
    assert (kind, reason) == ("Warning", "RolloutAborted") and CRASHING in message
    assert d.revisions.waiting_since is None and w.decide().revisions == d.revisions, "aborted for good"


def test_time_before_the_canarys_workloads_exist_does_not_count() -> None:
    """An engine building for the canary's revision: its slot is not rendered yet."""
    w = canary_world()
    for _ in range(4):
        w.slots.pop(Slot.B)
        w.wait(3600)
        d = w.decide()
        assert d.revisions.phase == RolloutPhase.PROGRESSING and d.revisions.waiting_since is None
    d = w.decide()
    assert d.revisions.waiting_since == w.now and d.requeue_after == 600


def test_each_step_and_the_promotion_wait_under_a_deadline_of_their_own() -> None:
    w = canary_world()
    w.decide()
    w.wait(590)
    w.ready()
    d = w.decide()  # ready with 10 s to spare: the step's pause starts, no deadline runs
    assert d.revisions.step_started_at == w.now and d.revisions.waiting_since is None
    assert d.requeue_after == 60
    w.wait(60)
    d = w.decide()  # step 2 wants a second canary replica
    assert d.revisions.canary_step == 1 and d.revisions.waiting_since == w.now
    w.wait(599)
    w.ready()
    w.decide()
    w.wait(60)
    d = w.decide()
    assert d.revisions.phase == RolloutPhase.PROMOTING and d.revisions.waiting_since == w.now
    w.ready(limit=1)  # 3 of 4: never the last one
    w.decide()
    w.wait(600)
    d = w.decide()
    assert d.revisions.phase == RolloutPhase.ABORTED
    assert (d.revisions.abort_reason or "").startswith(
        "the promotion: 3 of 4 canary replicas ready after 600 s"
    )
    assert d.slots == {Slot.A: SlotTarget("r1", 4), Slot.B: SlotTarget("r2", 0)}


def test_the_deadline_survives_a_restart_and_a_new_spec_restarts_it() -> None:
    w = canary_world()
    w.decide()
    started = w.now
    w.wait(300)
    assert w.decide().revisions.waiting_since == started, "read back from status: the same clock"
    w.revision = "r3"  # the canary restarts in the same slot with the new spec
    w.decide()
    d = w.decide()
    assert d.revisions.canary == "r3" and d.revisions.waiting_since == w.now


def test_the_reason_names_two_pods_and_counts_the_rest() -> None:
    pods = tuple(f"tiny-b-{i}: ImagePullBackOff: not found" for i in range(4))
    reason = words.deadline_passed("the promotion", 0, 4, 900, pods)
    assert reason == (
        "the promotion: 0 of 4 canary replicas ready after 900 s (rollout.canary.progressDeadlineSeconds): "
        "tiny-b-0: ImagePullBackOff: not found; tiny-b-1: ImagePullBackOff: not found (and 2 more)"
    )
