"""The status reducer: conditions kstatus, kubectl wait and Argo CD read, and the Events."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from llm_operator.controller.status.status import (
    UNPLACED_GRACE_SECONDS,
    Event,
    Observation,
    PoolObserved,
    reduce,
    unplaced_recheck_seconds,
)
from llm_operator.engine.state import EngineState, PoolEngineStatus
from llm_operator.plan.types import Plan, PlanningError, PoolPlan

POOL = PoolPlan(
    name="main",
    gpu_product="NVIDIA-H100-80GB-HBM3",
    allowed_products=("NVIDIA-H100-80GB-HBM3",),
    compute_capability=(9, 0),
    gpu_memory_mib=81559,
    tensor=4,
    pipeline=1,
    gpus_per_pod=4,
    pods_per_replica=1,
    replicas=2,
)
PLAN = Plan(pools=(POOL,), reason="tp=4 fits")
T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"


def conds(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def obs(
    ready: int, rolled: bool = True, engine: EngineState = EngineState.READY, generation: int = 3
) -> Observation:
    return Observation(
        generation=generation,
        plan=PLAN,
        engines={"main": PoolEngineStatus(engine, cache_key="k", message="job failed: OOM")},
        pools={"main": PoolObserved(desired=2, ready=ready, exists=True, rolled_out=rolled)},
        selector="llmoperator.io/deployment=x",
    )


def test_all_ready_is_ready_and_not_reconciling() -> None:
    status, events = reduce(obs(ready=2), None, T0)
    c = conds(status)
    assert c["Ready"] == ("True", "AllReplicasReady")
    assert c["Reconciling"][0] == "False" and c["Stalled"][0] == "False"
    assert status["phase"] == "Ready" and status["observedGeneration"] == 3
    assert all(x["observedGeneration"] == 3 for x in status["conditions"])
    assert [e.reason for e in events] == ["AllReplicasReady"]


def test_rollout_in_progress_is_reconciling() -> None:
    status, _ = reduce(obs(ready=1, rolled=False), None, T0)
    c = conds(status)
    assert c["Ready"] == ("False", "RollingOut")
    assert c["Reconciling"] == ("True", "RollingOut")
    assert status["phase"] == "Progressing"


def test_a_backend_without_engines_says_so_and_is_ready_as_any_other() -> None:
    """pytorch and cpu-reference: EngineReady True with its own reason, no status.engine."""
    status, _ = reduce(obs(ready=2, engine=EngineState.NOT_NEEDED), None, T0)
    c = conds(status)
    assert c["EngineReady"] == ("True", "EngineNotNeeded") and "engine" not in status
    assert c["Ready"] == ("True", "AllReplicasReady") and status["phase"] == "Ready"
    assert conds(reduce(obs(ready=2), None, T0)[0])["EngineReady"] == ("True", "EngineAvailable")


def test_engine_building_then_failed_while_serving_is_degraded_not_torn_down() -> None:
    building, _ = reduce(obs(ready=0, rolled=False, engine=EngineState.BUILDING), None, T0)
    assert status_phase(building) == "BuildingEngine"
    assert conds(building)["EngineReady"] == ("False", "EngineBuilding")
    failed, events = reduce(obs(ready=2, engine=EngineState.FAILED), building, T1)
    c = conds(failed)
    assert c["Stalled"] == ("True", "EngineBuildFailed")
    assert c["Degraded"] == ("True", "StalledWhileServing")
    assert failed["phase"] == "Degraded"
    assert any(e.type == "Warning" and e.reason == "EngineBuildFailed" for e in events)


def status_phase(status: dict[str, Any]) -> str:
    return str(status["phase"])


def test_planning_error_is_stalled_with_the_sentence() -> None:
    error = PlanningError("InsufficientGPUs", "no node offers 8 allocatable NVIDIA-H100-80GB-HBM3 GPUs")
    o = Observation(generation=1, plan=error, selector="s")
    status, events = reduce(o, None, T0)
    c = conds(status)
    assert c["Stalled"] == ("True", "InsufficientGPUs")
    assert c["Ready"][0] == "False"
    assert status["phase"] == "Failed"
    assert status["message"].startswith("no node offers 8")
    assert any(e.type == "Warning" and "no node offers" in e.message for e in events)


def test_transition_time_kept_when_status_unchanged_and_no_repeat_events() -> None:
    first, _ = reduce(obs(ready=2), None, T0)
    second, events = reduce(obs(ready=2), first, T1)
    assert first == second
    assert events == []


def test_losing_replicas_flips_ready_with_new_transition_time() -> None:
    first, _ = reduce(obs(ready=2), None, T0)
    second, events = reduce(obs(ready=1), first, T1)
    ready = next(c for c in second["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["lastTransitionTime"] == T1
    assert conds(second)["Available"][0] == "True"
    assert [e.reason for e in events] == ["WaitingForReplicas"]


def test_pods_that_cannot_start_make_the_deployment_degraded_with_the_reason() -> None:
    o = obs(ready=0, rolled=True)
    failing = Observation(o.generation, o.plan, o.engines, o.pools, o.selector,
                          pod_problems=("llama-0: ImagePullBackOff: image not found",))  # fmt: skip
    status, events = reduce(failing, None, T0)
    c = conds(status)
    assert c["Degraded"] == ("True", "PodsFailing")
    assert c["Ready"][0] == "False" and c["Stalled"][0] == "False"
    assert status["phase"] == "Degraded"
    assert "ImagePullBackOff" in status["message"]
    assert any(e.type == "Warning" and e.reason == "PodsFailing" for e in events)


def test_plan_warnings_are_kept_in_status_and_posted_once_when_they_change() -> None:
    warned = Plan(pools=(POOL,), reason="tp=4 fits", warnings=("pool main: the KV cache holds 1,000 tokens",))
    o = Observation(generation=3, plan=warned, pools={"main": PoolObserved(2, 2, True, True)}, selector="s")
    first, events = reduce(o, None, T0)
    assert first["placement"]["warnings"] == ["pool main: the KV cache holds 1,000 tokens"]
    assert [(e.type, e.reason) for e in events if e.reason == "PlacementWarning"] == [
        ("Warning", "PlacementWarning")
    ]
    again, events = reduce(o, first, T1)
    assert again == first and events == []
    cleared, events = reduce(obs(ready=2), first, T1)
    assert "warnings" not in cleared["placement"] and events == []


def test_a_pod_naming_a_missing_object_stalls_and_a_crash_loop_degrades() -> None:
    missing = 'x-0: Unschedulable: 0/20 nodes are available: persistentvolumeclaim "models" not found.'
    status, events = reduce(replace(obs(ready=1, rolled=False), pod_problems=(missing,)), None, T0)
    c = conds(status)
    assert c["Stalled"] == ("True", "MissingObject") and c["Reconciling"][0] == "False"
    assert c["Degraded"] == ("True", "StalledWhileServing"), "one replica still serves"
    assert status["message"] == missing and status["reason"] == "MissingObject"
    assert ("Warning", "MissingObject") in [(e.type, e.reason) for e in events]
    assert {"EngineReady", "Available"} <= set(c)

    crash = "x-1: CrashLoopBackOff: exited 1 (Error): bad config"
    status, _ = reduce(replace(obs(ready=1, rolled=False), pod_problems=(crash,)), None, T0)
    c = conds(status)
    assert c["Stalled"][0] == "False" and c["Degraded"] == ("True", "PodsFailing")
    assert crash in status["message"]


def test_a_launcher_that_refuses_to_start_stalls_in_its_words_and_what_serves_keeps_serving() -> None:
    line = "/engine-cache/e/rank1.engine not found: tp*pp = 2 ranks, one engine each"
    refused = f"x-1: LauncherRefused: {line}"
    status, events = reduce(replace(obs(ready=1, rolled=False), pod_problems=(refused,)), None, T0)
    c = conds(status)
    assert c["Stalled"] == ("True", "LauncherRefused") and c["Ready"] == ("False", "LauncherRefused")
    assert c["Reconciling"][0] == "False" and c["Available"][0] == "True"
    assert c["Degraded"] == ("True", "StalledWhileServing"), "the old replica keeps serving"
    assert status["reason"] == "LauncherRefused" and status["message"] == refused
    assert Event("Warning", "LauncherRefused", refused) in events
    # Nothing serves: Failed, and the Event is posted once, not on every pass.
    status, events = reduce(replace(obs(ready=0, rolled=False), pod_problems=(refused,)), None, T0)
    assert conds(status)["Stalled"] == ("True", "LauncherRefused") and status["phase"] == "Failed"
    again, events = reduce(replace(obs(ready=0, rolled=False), pod_problems=(refused,)), status, T1)
    assert not [e for e in events if e.reason == "LauncherRefused"]
    # Fixed (the files are there, the pods become ready): the stall clears.
    ready, _ = reduce(obs(ready=2), again, T1)
    assert conds(ready)["Stalled"][0] == "False" and ready["phase"] == "Ready"


def test_a_pod_the_scheduler_cannot_place_is_progress_until_the_grace_ends_then_degraded() -> None:
    # Capacity may free up or an autoscaler may add a node: Argo CD and kstatus read a Pending pod
    # as progress, so a transient wait for GPUs must not flash Degraded.
    words = "x-1: Unschedulable: 0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
    since = "2026-01-01T00:00:00Z"
    waiting = replace(obs(ready=1, rolled=True), unplaced=((words, since),))
    status, events = reduce(waiting, None, T1)
    c = conds(status)
    assert c["Reconciling"] == ("True", "WaitingForReplicas") and c["Degraded"][0] == "False"
    assert status["message"] == f"1/2 replicas ready; {words}", "the scheduler's words, at once"
    assert not [e for e in events if e.type == "Warning"]
    assert unplaced_recheck_seconds(waiting, T1) == UNPLACED_GRACE_SECONDS - 60

    due = f"2026-01-01T00:{UNPLACED_GRACE_SECONDS // 60:02d}:{UNPLACED_GRACE_SECONDS % 60:02d}Z"
    status, events = reduce(waiting, status, due)
    c = conds(status)
    assert c["Degraded"] == ("True", "PodsFailing") and c["Stalled"][0] == "False"
    assert words in status["message"]
    assert ("Warning", "PodsFailing") in [(e.type, e.reason) for e in events]
    assert unplaced_recheck_seconds(waiting, due) is None, "nothing left to wait for"


def test_pods_the_api_server_refuses_stall_with_its_words_and_what_serves_keeps_serving() -> None:
    refused = (
        'x: FailedCreate: create Pod x-1 in StatefulSet x failed error: pods "x-1" is forbidden: '
        "exceeded quota: pods, requested: pods=1, used: pods=1, limited: pods=1"
    )
    status, events = reduce(replace(obs(ready=1, rolled=False), pod_problems=(refused,)), None, T0)
    c = conds(status)
    assert c["Stalled"] == ("True", "FailedCreate") and c["Ready"] == ("False", "FailedCreate")
    assert c["Degraded"] == ("True", "StalledWhileServing") and c["Available"][0] == "True"
    assert status["reason"] == "FailedCreate" and "exceeded quota" in status["message"]
    assert ("Warning", "FailedCreate") in [(e.type, e.reason) for e in events]
    # A refused build pod too: the build never starts, and only the user can change that.
    building = replace(obs(ready=0, rolled=False, engine=EngineState.BUILDING), pod_problems=(refused,))
    status, _ = reduce(building, None, T0)
    assert conds(status)["Stalled"] == ("True", "FailedCreate") and status["phase"] == "Failed"


def test_a_failed_build_attempt_is_told_in_the_engine_message_not_as_a_failing_serving_pod() -> None:
    attempt = "x-build-abc12-q7x2z: Failed: exited 1 (Error): RuntimeError: CUDA out of memory"
    serving = "x-0: ImagePullBackOff: image not found"
    engine = PoolEngineStatus(
        EngineState.FAILED, cache_key="k", job="x-build-abc12", message="BackoffLimitExceeded"
    )
    observed = replace(obs(ready=2), engines={"main": engine}, pod_problems=(attempt,))
    status, events = reduce(observed, None, T0)
    message = next(c["message"] for c in status["conditions"] if c["type"] == "EngineReady")
    assert message == (
        "pool main: BackoffLimitExceeded; "
        "pod x-build-abc12-q7x2z exited 1 (Error): RuntimeError: CUDA out of memory"
    )
    assert conds(status)["Stalled"] == ("True", "EngineBuildFailed")
    assert any(e.reason == "EngineBuildFailed" and "CUDA out of memory" in e.message for e in events)
    # While the Job still retries, the failed attempt is told with the build; a serving pod's
    # problem still degrades the deployment.
    retrying = replace(engine, state=EngineState.BUILDING, message="")
    status, _ = reduce(
        replace(obs(ready=0, rolled=False), engines={"main": retrying}, pod_problems=(attempt, serving)),
        None,
        T0,
    )
    building = next(c["message"] for c in status["conditions"] if c["type"] == "EngineReady")
    assert building == "pool main: pod x-build-abc12-q7x2z exited 1 (Error): RuntimeError: CUDA out of memory"
    assert conds(status)["Degraded"] == ("True", "PodsFailing")
    degraded = next(c["message"] for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded == serving


def test_a_canary_that_cannot_start_leaves_the_stable_revision_available() -> None:
    """The current slot (the canary's) has no ready pod, the stable one serves: Available counts
    both revisions, and the replica counts are the deployment's."""
    from llm_operator.api.v1alpha1 import RevisionsStatus

    revisions = RevisionsStatus.model_validate(
        {"stable": "aaa", "stableSlot": "a", "canary": "bbb", "canarySlot": "b", "phase": "Progressing",
         "stableReplicas": 2, "stableReadyReplicas": 2, "canaryReplicas": 1, "canaryReadyReplicas": 0,
         "canaryStep": 0, "canaryWeight": 0, "message": "waiting for the weight to take effect"}
    )  # fmt: skip
    canary_slot = replace(obs(ready=0, rolled=False), revisions=revisions, total=2)
    stuck = ("tiny-b-0: Unschedulable: 0/1 nodes are available: 1 Insufficient cpu",)
    status, _ = reduce(replace(canary_slot, pod_problems=stuck), None, T0)
    c = conds(status)
    assert c["Available"] == ("True", "MinimumReplicasAvailable")
    assert c["Reconciling"] == ("True", "CanaryProgressing") and c["Degraded"] == ("True", "PodsFailing")
    assert status["replicas"] == 2 and status["readyReplicas"] == 2
