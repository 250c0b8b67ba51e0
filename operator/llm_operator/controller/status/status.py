"""Status reducer: what was planned and observed -> status, conditions and transition Events.

Pure and total: every input combination yields a status, so the reconcile never has to decide
what to report. Conditions follow metav1.Condition; Ready plus the kstatus pair
Reconciling/Stalled let kubectl wait, Flux, Argo CD and kpt read progress without knowing us.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from llm_operator.api.v1alpha1 import Phase, RevisionsStatus, RolloutPhase
from llm_operator.controller.status import autoscaling, cold_start, hold_status, model_status, router_status
from llm_operator.controller.status.conditions import FAILED_POD as FAILED_POD
from llm_operator.controller.status.conditions import LAUNCHER_REFUSED as LAUNCHER_REFUSED
from llm_operator.controller.status.conditions import available as _available
from llm_operator.controller.status.conditions import cond as _cond
from llm_operator.controller.status.conditions import stalled as _stalled
from llm_operator.engine.state import EngineState, ModelState, ModelStatus, PoolEngineStatus
from llm_operator.plan.types import Plan, PlanningError


@dataclass(frozen=True)
class PoolObserved:
    """What the StatefulSets of one pool report."""

    desired: int
    ready: int = 0
    exists: bool = False
    rolled_out: bool = False  # controller caught up with our template and all pods updated


REFUSED = "FailedCreate"  # problem reason of a StatefulSet or Job the API server refused a pod
# A pod the scheduler cannot place may be placed once capacity frees up or an autoscaler adds a
# node (GPU nodes take minutes): until then it is progress, as Argo CD and kstatus read a Pending
# pod, and the scheduler's words are in the message. Past this, someone must act: Degraded.
UNPLACED_GRACE_SECONDS = 300
# The scheduler's and kubelet's words for an object the pod names that does not exist.
MISSING_OBJECT = re.compile(r'(persistentvolumeclaim|secret|configmap) "[^"]+" not found', re.I)


@dataclass(frozen=True)
class Observation:
    generation: int
    plan: Plan | PlanningError
    engines: dict[str, PoolEngineStatus] = field(default_factory=dict)
    pools: dict[str, PoolObserved] = field(default_factory=dict)
    selector: str = ""
    endpoints: dict[str, str] = field(default_factory=dict)
    invalid_spec: str | None = None  # the stored object does not validate (e.g. an old CRD)
    pod_problems: tuple[str, ...] = ()  # "pod: Reason: message" of serving pods that cannot run
    unplaced: tuple[tuple[str, str], ...] = ()  # ("pod: Unschedulable: why", since) of pods pending
    autoscaler: autoscaling.AutoscalerObserved | None = None  # spec.autoscaling is set
    revisions: RevisionsStatus | None = None  # the rollout decided in this pass (None: none was)
    total: int | None = None  # replicas of both slots together (the scale subresource's count)
    route_problem: str | None = None  # the gateway-api route cannot carry traffic: why
    router: router_status.RouterObserved | None = None  # routing.mode inference-pool only
    model: ModelStatus | None = None  # the model cache (s3:// and hf:// sources)
    release: dict[str, str] | None = None  # status.release (release_pin.release_status)
    cold_starts: tuple[cold_start.ColdStart, ...] = ()  # measured, not yet reported (observe/cold_start.py)
    hold: hold_status.HoldObserved | None = None  # autoscaling.minReplicas 0 only


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


def reduce(
    obs: Observation, old_status: dict[str, Any] | None, now: str
) -> tuple[dict[str, Any], list[Event]]:
    """New status and the Events for condition transitions since old_status."""
    g = obs.generation
    conds: list[dict[str, Any]]
    status: dict[str, Any] = {"observedGeneration": g, "selector": obs.selector}
    for owned in ("launchSecret", "adminKeySecret", "pickerTlsSecret"):
        if (old_status or {}).get(owned):
            # Written once, when the operator creates the Secret (controller/secrets/owned_secret.py): its
            # proof of whose the Secret is, as it never reads one.
            status[owned] = (old_status or {})[owned]
    ready_total = sum(p.ready for p in obs.pools.values())
    serving = ready_total > 0
    status["readyReplicas"] = ready_total
    status |= {"release": obs.release} if obs.release else {}

    if obs.invalid_spec is not None or isinstance(obs.plan, PlanningError):
        reason, message = (
            ("InvalidSpec", obs.invalid_spec)
            if obs.invalid_spec is not None
            else (obs.plan.reason, obs.plan.message)  # type: ignore[union-attr]
        )
        status["replicas"] = sum(p.desired for p in obs.pools.values())
        conds, phase = _stalled(reason, message, serving, g)
        return _finish(obs, status, conds + _autoscaling(obs), phase, reason, message, old_status, now)

    plan = obs.plan
    desired = plan.replicas
    status["replicas"] = desired
    status["placement"] = _placement(plan, obs)
    engines = obs.engines
    placement_events = _placement_warnings(plan, old_status)
    engines, pod_problems = _with_build_attempts(engines, obs.pod_problems)
    waiting = [p for p, since in obs.unplaced if _age(since, now) < UNPLACED_GRACE_SECONDS]
    pod_problems += tuple(p for p, _ in obs.unplaced if p not in waiting)
    pod_problems = model_status.without_fetch_attempts(obs.model, pod_problems)
    failed = [(n, e) for n, e in engines.items() if e.state == EngineState.FAILED]
    building = [(n, e) for n, e in engines.items() if e.state == EngineState.BUILDING]
    waiting_model = [(n, e) for n, e in engines.items() if e.state == EngineState.WAITING]
    model_failed = model_status.failure(obs.model)
    fetching = obs.model is not None and obs.model.state == ModelState.FETCHING
    if (model_fields := model_status.fields(obs.model)) is not None:
        status["model"] = model_fields
    if engines:
        primary = engines.get(plan.primary.name)
        if primary is not None and primary.state != EngineState.NOT_NEEDED:
            status["engine"] = {
                k: v
                for k, v in {
                    "cacheKey": primary.cache_key,
                    "ready": primary.state == EngineState.READY,
                    "uri": primary.uri,
                    "buildJob": primary.job,
                }.items()
                if v is not None
            }
    if failed:
        engine_cond = _cond("EngineReady", False, "EngineBuildFailed", _join(failed), g)
    elif building:
        engine_cond = _cond("EngineReady", False, "EngineBuilding", _join(building), g)
    elif waiting_model:
        engine_cond = _cond("EngineReady", False, "WaitingForModel", _join(waiting_model), g)
    elif engines and all(e.state == EngineState.NOT_NEEDED for e in engines.values()):
        engine_cond = _cond("EngineReady", True, "EngineNotNeeded", "this backend builds no engine", g)
    else:
        engine_cond = _cond("EngineReady", True, "EngineAvailable", "", g)

    rolled = all(obs.pools.get(p.name, PoolObserved(desired=p.replicas)).rolled_out for p in plan.pools)
    all_ready = rolled and ready_total >= desired and not failed and not building
    all_ready = all_ready and not model_failed and not fetching and not waiting_model
    if obs.endpoints:
        status["endpoints"] = obs.endpoints
    model_conds = model_status.condition(obs.model, g)

    if model_failed:
        reason, message = model_failed
        conds, phase = _stalled(reason, message, serving, g)
    elif failed:
        reason, message = "EngineBuildFailed", _join(failed)
        conds, phase = _stalled(reason, message, serving, g)
    elif all_ready:
        reason = "AllReplicasReady" if desired else "ScaledToZero"
        message = f"{ready_total}/{desired} replicas ready"
        conds = [
            _cond("Ready", True, reason, message, g),
            _cond("Reconciling", False, reason, "", g),
            _cond("Stalled", False, reason, "", g),
            _cond("Progressing", True, "RolloutComplete", message, g),
            _cond("Degraded", False, "AsExpected", "", g),
        ]
        phase = Phase.READY
    else:
        if fetching and obs.model is not None:
            reason, message = model_status.FETCHING, model_status.fetching_message(obs.model)
            phase = Phase.FETCHING_MODEL
        elif building:
            reason, message = "BuildingEngine", _join(building)
            phase = Phase.BUILDING_ENGINE
        elif not rolled:
            reason, message = "RollingOut", f"{ready_total}/{desired} replicas ready, rolling out"
            phase = Phase.PROGRESSING if serving else Phase.DEPLOYING
        else:
            reason, message = "WaitingForReplicas", f"{ready_total}/{desired} replicas ready"
            phase = Phase.PROGRESSING if serving else Phase.DEPLOYING
        message = "; ".join([message, *waiting])
        degraded = _cond("Degraded", False, "AsExpected", "", g)
        # A claim, Secret or ConfigMap the pods need does not exist, the API server refuses the
        # pods (Pod Security, a quota) or their launcher refuses to start (a missing tokenizer,
        # engine rank file or model.py: its line names the path): only the user can fix it.
        missing = [p for p in pod_problems if MISSING_OBJECT.search(p)]
        refused = [p for p in pod_problems if f": {REFUSED}: " in p]
        launcher = [p for p in pod_problems if f": {LAUNCHER_REFUSED}: " in p]
        if missing or refused or launcher:
            reason = "MissingObject" if missing else REFUSED if refused else LAUNCHER_REFUSED
            message = "; ".join(missing or refused or launcher)
            conds, phase = _stalled(reason, message, serving, g)
            conds += [engine_cond, *model_conds]
            conds += [_cond("Available", serving or desired == 0, _available(serving), "", g)]
            conds += _autoscaling(obs)
            status, events = _finish(obs, status, conds, phase, reason, message, old_status, now)
            return status, placement_events + events
        if pod_problems:
            # Kubernetes keeps retrying (image pulls, restarts), so this is not Stalled, but the
            # user must usually act: say which pod and why.
            reason, message = "PodsFailing", "; ".join(pod_problems)
            degraded = _cond("Degraded", True, reason, message, g)
            phase = Phase.DEGRADED
        conds = [
            _cond("Ready", False, reason, message, g),
            _cond("Reconciling", True, reason, message, g),
            _cond("Stalled", False, reason, "", g),
            _cond("Progressing", True, reason, message, g),
            degraded,
        ]
    conds += [engine_cond, *model_conds]
    conds.append(_cond("Available", serving or desired == 0, _available(serving), "", g))
    conds += _autoscaling(obs)
    status, events = _finish(obs, status, conds, phase, reason, message, old_status, now)
    return status, placement_events + events


def _autoscaling(obs: Observation) -> list[dict[str, Any]]:
    """AutoscalingActive, only while spec.autoscaling is set: reported, never acted on."""
    return [] if obs.autoscaler is None else [autoscaling.condition(obs.autoscaler, obs.generation)]


def _placement_warnings(plan: Plan, old_status: dict[str, Any] | None) -> list[Event]:
    """A plan that serves but falls short of the spec (a KV cache smaller than the batch limits,
    memory not checked, replicas beyond the nodes' capacity) is posted once, when what it says
    changes; status.placement.warnings keeps it visible."""
    before = ((old_status or {}).get("placement") or {}).get("warnings") or []
    if not plan.warnings or list(plan.warnings) == before:
        return []
    return [Event("Warning", "PlacementWarning", "; ".join(plan.warnings))]


def _age(since: str, now: str) -> float:
    return (datetime.fromisoformat(now) - datetime.fromisoformat(since)).total_seconds()


def unplaced_recheck_seconds(obs: Observation, now: str) -> float | None:
    """When the first pod still within its grace turns from progress into Degraded."""
    left = [UNPLACED_GRACE_SECONDS - _age(since, now) for _, since in obs.unplaced]
    pending = [seconds for seconds in left if seconds > 0]
    return max(1.0, min(pending)) if pending else None


def _with_build_attempts(
    engines: dict[str, PoolEngineStatus], pod_problems: tuple[str, ...]
) -> tuple[dict[str, PoolEngineStatus], tuple[str, ...]]:
    """Failed build pods belong in their engine's message (the log tail says why the build
    failed), not among the serving pods that cannot run. A Job names its pods `<job>-<suffix>`."""
    by_job = {e.job: n for n, e in engines.items() if e.job and e.state != EngineState.READY}
    attempts: dict[str, list[str]] = {}
    rest = []
    for problem in pod_problems:
        pod, _, why = problem.partition(": ")
        pool = by_job.get(pod.rpartition("-")[0])
        if pool is not None and why.startswith(f"{FAILED_POD}: "):
            attempts.setdefault(pool, []).append(f"pod {pod} {why.removeprefix(f'{FAILED_POD}: ')}")
        else:
            rest.append(problem)
    with_attempts = {
        n: replace(e, message="; ".join([e.message, attempts[n][-1]] if e.message else attempts[n][-1:]))
        if n in attempts
        else e
        for n, e in engines.items()
    }
    return with_attempts, tuple(rest)


def _join(items: list[tuple[str, PoolEngineStatus]]) -> str:
    return "; ".join(f"pool {n}: {e.message}" if e.message else f"pool {n}" for n, e in items)


def _placement(plan: Plan, obs: Observation) -> dict[str, Any]:
    p = plan.primary
    placement: dict[str, Any] = {
        "gpuProduct": p.gpu_product,
        "tensorParallelism": p.tensor,
        "pipelineParallelism": p.pipeline,
        "gpusPerReplica": p.tensor * p.pipeline if p.gpus_per_pod else 0,
        "gpusPerPod": p.gpus_per_pod,
        "podsPerReplica": p.pods_per_replica,
        "reason": plan.reason,
    }
    if plan.warnings:
        placement["warnings"] = list(plan.warnings)
    if len(plan.pools) > 1:
        placement["pools"] = [
            {
                "name": pool.name,
                "gpuProduct": pool.gpu_product,
                "replicas": pool.replicas,
                "readyReplicas": obs.pools.get(pool.name, PoolObserved(desired=0)).ready,
            }
            for pool in plan.pools
        ]
    return placement


_WARNING_WHEN = {
    "Stalled": "True",
    "Degraded": "True",
    "EngineReady": "False",
    autoscaling.CONDITION: "False",
    router_status.CONDITION: "False",
    hold_status.CONDITION: "False",
}
_EVENT_TYPES = ("Ready", *_WARNING_WHEN)  # each transition of these is an Event


def _finish(
    obs: Observation,
    status: dict[str, Any],
    conds: list[dict[str, Any]],
    phase: Phase,
    reason: str,
    message: str,
    old_status: dict[str, Any] | None,
    now: str,
) -> tuple[dict[str, Any], list[Event]]:
    conds, phase, reason, message = _rollout(obs, status, conds, phase, reason, message, old_status)
    serving = status.get("readyReplicas", 0) > 0
    adjusted = router_status.adjust(obs.router, conds, phase, reason, message, serving, obs.generation)
    conds, phase, reason, message = adjusted
    old = {c["type"]: c for c in (old_status or {}).get("conditions", [])}
    last, news = cold_start.report(obs.cold_starts, old_status)
    status |= {"lastColdStart": last} if last else {}
    conds = [*conds, hold_status.condition(obs.hold, last, obs.generation)] if obs.hold is not None else conds
    events = [Event("Normal", cold_start.EVENT_REASON, s.message()) for s in news]
    for c in conds:
        prev = old.get(c["type"])
        changed = prev is None or prev.get("status") != c["status"]
        c["lastTransitionTime"] = now if changed else prev.get("lastTransitionTime", now)  # type: ignore[union-attr]
        warn = _WARNING_WHEN.get(c["type"]) == c["status"]
        # A new reason is news only for a condition that needs attention (a different failure).
        reason_changed = warn and prev is not None and prev.get("reason") != c["reason"]
        if c["type"] in _EVENT_TYPES and (changed or reason_changed):
            first_and_quiet = (
                prev is None and not warn and not (c["type"] == "Ready" and c["status"] == "True")
            )
            if first_and_quiet:  # first status: report only what needs attention or what succeeded
                continue
            text = c["message"] or f"{c['type']} is {c['status']}"
            events.append(Event("Warning" if warn else "Normal", c["reason"], text))
    status |= {"conditions": conds, "phase": phase.value, "reason": reason, "message": message}
    return status, events


_CANARY_REASONS = {
    RolloutPhase.PROGRESSING: "CanaryProgressing",
    RolloutPhase.PAUSED: "CanaryPaused",
    RolloutPhase.PROMOTING: "CanaryPromoting",
}


def _rollout(
    obs: Observation,
    status: dict[str, Any],
    conds: list[dict[str, Any]],
    phase: Phase,
    reason: str,
    message: str,
    old_status: dict[str, Any] | None,
) -> tuple[list[dict[str, Any]], Phase, str, str]:
    """status.revisions, and while a canary runs the conditions say where it stands. The
    revisions are the rollout's memory (its timers): a pass that decided nothing keeps them."""
    g, r = obs.generation, obs.revisions
    if r is None:
        if (old_status or {}).get("revisions"):
            status["revisions"] = old_status["revisions"]  # type: ignore[index]
        return conds, phase, reason, message
    status["revisions"] = r.model_dump(mode="json", by_alias=True, exclude_none=True)
    if r.canary is not None and obs.total is not None:
        status["replicas"] = obs.total
        status["readyReplicas"] = (r.stable_ready_replicas or 0) + (r.canary_ready_replicas or 0)
    serving = status.get("readyReplicas", 0) > 0
    kept = [c for c in conds if c["type"] not in _ROLLOUT_TYPES]
    if r.canary is not None:  # both revisions serve: available if either has a ready replica
        kept = [_cond("Available", serving, _available(serving), "", g) if c["type"] == "Available" else c
                for c in kept]  # fmt: skip
    if obs.route_problem is not None:
        reason, message = "RouteNotAccepted", obs.route_problem
        stalled, phase = _stalled(reason, message, serving, g)
        return stalled + kept, phase, reason, message
    if r.canary is None or any(c["type"] == "Stalled" and c["status"] == "True" for c in conds):
        return conds, phase, reason, message
    if r.phase == RolloutPhase.ABORTED:
        reason, message = "RolloutAborted", r.message or r.abort_reason or "aborted"
        stalled, _ = _stalled(reason, message, serving, g)
        degraded = _cond("Degraded", True, reason, f"{r.abort_reason}; revision {r.stable} keeps serving", g)
        return (
            [degraded if c["type"] == "Degraded" else c for c in stalled] + kept,
            Phase.DEGRADED,
            reason,
            message,
        )
    reason = _CANARY_REASONS.get(r.phase or RolloutPhase.PROGRESSING, "CanaryProgressing")
    message = r.message or ""
    degraded = next(c for c in conds if c["type"] == "Degraded")
    rollout = [
        _cond("Ready", False, reason, message, g),
        _cond("Reconciling", True, reason, message, g),
        _cond("Stalled", False, reason, "", g),
        _cond("Progressing", True, reason, message, g),
        degraded,
    ]
    phase = Phase.DEGRADED if degraded["status"] == "True" else Phase.PROGRESSING
    return rollout + kept, phase, reason, message


_ROLLOUT_TYPES = ("Ready", "Reconciling", "Stalled", "Progressing", "Degraded")
