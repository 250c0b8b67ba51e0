"""LLMDeployments in every phase GitOps tools must judge, with the status the operator writes.

Every status comes from the operator's own status reducer (controller/status/status.py `reduce`), canary
phases included, so the checks follow what it really writes.

These objects are also Argo CD's test inputs (charts/llm-operator/argocd/.../testdata), written
from here: regenerate after an intended change with `UPDATE_GOLDEN=1` (tests/gitops).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any

from llm_operator.api.crd import openapi_schema
from llm_operator.api.v1alpha1 import RevisionsStatus
from llm_operator.controller.status.status import Observation, PoolObserved, reduce
from llm_operator.engine.state import EngineState, PoolEngineStatus
from llm_operator.plan.types import Plan, PlanningError, PoolPlan

NAME, NAMESPACE, GENERATION = "llama", "serving", 3
T0, T1 = "2026-11-23T20:00:00Z", "2026-11-23T20:05:00Z"
STABLE, CANARY = "6d4f9c2a1b", "9a1b22c3d4"
POOL = PoolPlan(
    name="main",
    gpu_product="NVIDIA-H100-80GB-HBM3",
    allowed_products=("NVIDIA-H100-80GB-HBM3",),
    compute_capability=(9, 0),
    gpu_memory_mib=81559,
    tensor=2,
    pipeline=1,
    gpus_per_pod=2,
    pods_per_replica=1,
    replicas=3,
)
PLAN = Plan(pools=(POOL,), reason="tp=2 fits the model and its KV cache on NVIDIA-H100-80GB-HBM3")
SPEC: dict[str, Any] = {
    "model": {"name": "llama-3-8b", "source": {"uri": "pvc://models/llama-3-8b"}},
    "replicas": 3,
    "rollout": {
        "strategy": "canary",
        "canary": {"steps": [{"weight": 10, "pauseSeconds": 60}, {"weight": 50}]},
    },
}


# What the API server returns for a new LLMDeployment (the CRD's default status; the schema's
# inner defaults add replicas and readyReplicas).
CREATED = {**openapi_schema()["properties"]["status"]["default"], "readyReplicas": 0, "replicas": 0}


@dataclass(frozen=True)
class Case:
    obj: dict[str, Any]
    kstatus: str  # what sigs.k8s.io/cli-utils kstatus says
    health: str | None  # what our health.lua says; None: Argo CD decides before any script runs


def _engine(state: EngineState, message: str = "") -> dict[str, PoolEngineStatus]:
    return {"main": PoolEngineStatus(state, cache_key="3f1e", job="llama-engine-3f1e", message=message)}


def _obs(ready: int, exists: bool = True, rolled: bool = True, **kw: Any) -> Observation:
    obs = Observation(
        generation=GENERATION,
        plan=PLAN,
        engines=_engine(EngineState.READY),
        pools={"main": PoolObserved(desired=3, ready=ready, exists=exists, rolled_out=rolled)},
        selector="llmoperator.io/deployment=llama,llmoperator.io/role=leader",
    )
    return replace(obs, **kw)


def _status(obs: Observation) -> dict[str, Any]:
    return reduce(obs, None, T0)[0]


def llmd(status: dict[str, Any] | None, **metadata: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "llmoperator.io/v1alpha1",
        "kind": "LLMDeployment",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "generation": GENERATION, **metadata},
        "spec": copy.deepcopy(SPEC),
    }
    if status is not None:
        obj["status"] = status
    return obj


def _cond(kind: str, ok: bool, reason: str, message: str = "") -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message,
        "observedGeneration": GENERATION,
        "lastTransitionTime": T1,
    }


def _canary(phase: str, **revisions: Any) -> dict[str, Any]:
    """The status the operator's reducer writes with a canary in `phase`."""
    rev: dict[str, Any] = {
        "stable": STABLE,
        "stableSlot": "a",
        "canary": CANARY,
        "canarySlot": "b",
        "canaryStep": 0,
        "canaryWeight": 10,
        "stableReplicas": 3,
        "stableReadyReplicas": 3,
        "canaryReplicas": 1,
        "canaryReadyReplicas": 1,
        "phase": phase,
        "stepStartedAt": T1,
        **revisions,
    }
    return _status(_obs(ready=1, revisions=RevisionsStatus.model_validate(rev), total=3))


def _stable(revision: str, slot: str) -> dict[str, Any]:
    rev = RevisionsStatus.model_validate({"stable": revision, "stableSlot": slot, "phase": "Stable"})
    return _status(_obs(ready=3, revisions=rev, total=3))


def cases() -> dict[str, Case]:
    ready = _status(_obs(ready=3))
    stable, promoted = _stable(STABLE, "a"), _stable(CANARY, "b")
    building = _obs(ready=0, exists=False, rolled=False, engines=_engine(EngineState.BUILDING, "job running"))
    build_failed = _engine(EngineState.FAILED, "job failed: the engine build ran out of GPU memory")
    no_gpus = PlanningError("InsufficientGPUs", "no node offers 2 allocatable NVIDIA-H100-80GB-HBM3 GPUs")
    missing = 'llama-0: FailedMount: persistentvolumeclaim "models" not found'
    refused = "llama: FailedCreate: create Pod llama-1 in StatefulSet llama failed error: pods forbidden"
    no_room = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
    return {
        # Without a status kstatus reads "no conditions" as Current: the CRD defaults one.
        "no_status": Case(llmd(None), "Current", "Progressing"),
        # Created, the operator has not written yet: the CRD's default status.
        "created": Case(llmd(CREATED), "InProgress", "Progressing"),
        # The operator's first write: nothing exists yet, Reconciling=True and observedGeneration.
        "first_sight": Case(
            llmd(_status(_obs(ready=0, exists=False, rolled=False))), "InProgress", "Progressing"
        ),
        "building_engine": Case(llmd(_status(building)), "InProgress", "Progressing"),
        "deploying": Case(llmd(_status(_obs(ready=0, rolled=False))), "InProgress", "Progressing"),
        "rolling_out": Case(llmd(_status(_obs(ready=2, rolled=False))), "InProgress", "Progressing"),
        "ready": Case(llmd(ready), "Current", "Healthy"),
        "scaled_to_zero": Case(
            llmd(_status(replace(_obs(ready=0), plan=Plan((replace(POOL, replicas=0),), PLAN.reason)))),
            "Current",
            "Healthy",
        ),
        # Kubernetes retries (image pull, crash loop): not Stalled, but a person must look.
        "pods_failing": Case(
            llmd(
                _status(_obs(ready=2, rolled=False, pod_problems=("llama-2: ImagePullBackOff: not found",)))
            ),
            "InProgress",
            "Degraded",
        ),
        # The scheduler cannot place a pod yet (capacity may free up or be added): progress.
        "pod_waiting_for_capacity": Case(
            llmd(_status(_obs(ready=2, unplaced=((f"llama-2: Unschedulable: {no_room}", T0),)))),
            "InProgress",
            "Progressing",
        ),
        "planning_error": Case(
            llmd(_status(Observation(GENERATION, no_gpus, selector="s"))), "Failed", "Degraded"
        ),
        "engine_build_failed_while_serving": Case(
            llmd(_status(_obs(ready=3, engines=build_failed))), "Failed", "Degraded"
        ),
        "missing_object": Case(
            llmd(_status(_obs(ready=0, rolled=False, pod_problems=(missing,)))), "Failed", "Degraded"
        ),
        # Pod Security or a quota refuses the pods: nothing retries its way out of it.
        "pods_refused_while_serving": Case(
            llmd(_status(_obs(ready=1, rolled=False, pod_problems=(refused,)))), "Failed", "Degraded"
        ),
        # A spec change the operator has not seen yet: the old Ready says nothing about it.
        "generation_behind": Case(llmd(ready, generation=GENERATION + 1), "InProgress", "Progressing"),
        "stalled_generation_behind": Case(
            llmd(_status(Observation(GENERATION, no_gpus, selector="s")), generation=GENERATION + 1),
            "InProgress",
            "Progressing",
        ),
        # Argo CD itself reports an object being deleted as Progressing ("Pending deletion").
        "deleting": Case(llmd(ready, deletionTimestamp=T1, finalizers=["x"]), "Terminating", None),
        "stable": Case(llmd(stable), "Current", "Healthy"),
        "canary_progressing": Case(
            llmd(_canary("Progressing", message="step 1 of 2: 10% for 60 s, 41 s left")),
            "InProgress",
            "Progressing",
        ),
        "canary_paused": Case(
            llmd(
                _canary(
                    "Paused",
                    canaryStep=1,
                    canaryWeight=50,
                    pausedReason="UntilPromoted",
                    message="step 2 of 2: 50%, paused until promoted",
                    lastAction="promote/1795464000",
                ),
                annotations={"llmoperator.io/rollout-action": "promote/1795464000"},
            ),
            "InProgress",
            "Suspended",
        ),
        "canary_inconclusive": Case(
            llmd(
                _canary(
                    "Paused",
                    pausedReason="Inconclusive",
                    message="analysis inconclusive: 3 of 20 requests in the window; promote or abort",
                )
            ),
            "InProgress",
            "Suspended",
        ),
        "canary_promoting": Case(
            llmd(_canary("Promoting", canaryStep=1, canaryWeight=50, message="scaling the canary to 3")),
            "InProgress",
            "Progressing",
        ),
        "canary_aborted": Case(
            llmd(
                _canary(
                    "Aborted",
                    canaryWeight=0,
                    abortedAt=T1,
                    abortReason="canary p99 TTFT 1,840 ms > budget 1,000 ms in 1 of 1 windows",
                )
            ),
            "Failed",
            "Degraded",
        ),
        "promoted": Case(llmd(promoted), "Current", "Healthy"),
    }
