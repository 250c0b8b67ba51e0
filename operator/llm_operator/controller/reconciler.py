"""One level-based reconcile per LLMDeployment, driven by a de-duplicating work queue.

Every trigger (the LLMDeployment changed, a child changed or vanished, the GPU inventory changed)
only enqueues the deployment's key; the reconcile then reads the current state and converges:
plan -> engines -> desired children -> apply what differs -> prune -> status. It never branches on
what woke it, so a missed or duplicated event cannot leave things wrong.

Writes are kept to what changed: a child is applied only when its rendered form differs from what
was last applied or when someone else changed it (drift), and status is patched only when it
differs. An idle cluster therefore sees no writes from the operator.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from lightkube import ApiError
from pydantic import ValidationError

from llm_operator import labels as L
from llm_operator.api.v1alpha1 import LLMDeployment
from llm_operator.controller.config import OperatorConfig
from llm_operator.controller.kube import CHILD_KINDS, Kube, ObjKey, obj_key
from llm_operator.controller.metrics import DEPLOYMENTS, QUEUE_DEPTH, RECONCILE_ERRORS, RECONCILE_SECONDS
from llm_operator.controller.status import (
    EngineState,
    Observation,
    PoolEngineStatus,
    PoolObserved,
    reduce,
)
from llm_operator.engine import build_job, cache_key
from llm_operator.plan.cpu import cpu_plan
from llm_operator.plan.inventory import Inventory
from llm_operator.plan.planner import plan_deployment
from llm_operator.plan.types import Plan, PlanningError, PoolPlan
from llm_operator.render import names
from llm_operator.render.children import (
    PoolEngine,
    build_children,
    needs_engine,
    owner_reference,
    serving_selector,
)
from llm_operator.render.services import endpoints
from llm_operator.render.serving import POD_INDEX, EngineLocation, engine_location

log = logging.getLogger(__name__)

ENGINE_INDEX = "llm-engine-cache-index"  # per namespace: cache keys whose build Job succeeded
Key = tuple[str, str]  # namespace, name


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


# Consecutive failed reconciles (about 3.5 s of backoff) before the error goes into status.
REPORT_AFTER_FAILURES = 4


@dataclass
class Applied:
    digest: str
    generation: int | None  # None for kinds without metadata.generation
    desired: dict[str, Any] | None  # kept only without a generation: drift is then found by content


class Reconciler:
    def __init__(self, kube: Kube, config: OperatorConfig) -> None:
        self.kube = kube
        self.config = config
        self.inventory = Inventory()
        self.children: dict[ObjKey, dict[str, Any]] = {}  # watch cache of our children
        self.applied: dict[ObjKey, Applied] = {}
        self.statuses: dict[Key, dict[str, Any]] = {}  # last status written, for the gauge
        self.known: set[Key] = set()
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._queued: set[Key] = set()
        self._active: set[Key] = set()
        self._again: set[Key] = set()
        self.leader_worker_set = False  # render multi-node replicas as LeaderWorkerSets
        self.pod_problems: dict[Key, dict[str, str]] = {}  # deployment -> pod -> why it cannot run
        self._broken_groups: set[tuple[str, str, str, str]] = set()  # being recreated
        self._group_failures: dict[str | None, None] = {}  # failed pods already acted on (by uid)
        self._failures: dict[Key, int] = {}  # consecutive failed reconciles

    # -- queue ---------------------------------------------------------------------------------

    def enqueue(self, key: Key) -> None:
        if key in self._active:
            self._again.add(key)  # run once more after the current pass, never concurrently
        elif key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)
        QUEUE_DEPTH.set(len(self._queued))

    async def worker(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            self._active.add(key)
            QUEUE_DEPTH.set(len(self._queued))
            try:
                await self._run(key)
            finally:
                self._active.discard(key)
                if key in self._again:
                    self._again.discard(key)
                    self.enqueue(key)

    async def _run(self, key: Key) -> None:
        start = time.perf_counter()
        try:
            await self.reconcile(*key)
            self._failures.pop(key, None)
        except ApiError as e:
            RECONCILE_ERRORS.labels(f"Api{e.status.code}").inc()
            await self._failed(key, f"API error {e.status.code}: {e.status.message}")
        except Exception as e:
            RECONCILE_ERRORS.labels(type(e).__name__).inc()
            log.exception("reconcile of %s/%s failed", *key)
            await self._failed(key, f"{type(e).__name__}: {e}")
        finally:
            RECONCILE_SECONDS.observe(time.perf_counter() - start)

    async def _failed(self, key: Key, why: str) -> None:
        """Retry with backoff; once it has failed REPORT_AFTER_FAILURES times in a row, say so in
        status (Stalled, the error, an Event) rather than retry silently. Nothing running is touched;
        the next successful pass writes the normal status back."""
        attempt = self._failures[key] = self._failures.get(key, 0) + 1
        delay = min(60.0, 0.5 * 2 ** (attempt - 1))
        log.warning("retrying %s/%s in %.1f s: %s", *key, delay, why)
        if attempt >= REPORT_AFTER_FAILURES:
            try:
                body = await self.kube.get_deployment(*key)
                if body is not None and not body["metadata"].get("deletionTimestamp"):
                    obs = Observation(
                        int(body["metadata"].get("generation", 0)),
                        PlanningError("ReconcileFailed", f"{why} (attempt {attempt}, retrying)"),
                        pools=self._observe_existing(*key),
                        selector=serving_selector(key[1]),
                    )
                    await self._write_status(body, obs, body.get("status") or {})
            except Exception:  # the API is what fails: the retry below is all that is left
                log.exception("cannot report the failure of %s/%s", *key)

        async def later() -> None:
            await asyncio.sleep(delay)
            self.enqueue(key)

        asyncio.get_running_loop().create_task(later())

    # -- triggers ------------------------------------------------------------------------------

    def deployment_event(self, event: str, namespace: str, name: str) -> None:
        key = (namespace, name)
        if event == "DELETED":
            self.forget(key)
        else:
            self.known.add(key)
            self.enqueue(key)

    def forget(self, key: Key) -> None:
        """Children go with the owner (garbage collector); drop what we remember of them."""
        self.known.discard(key)
        self._failures.pop(key, None)
        self.statuses.pop(key, None)
        self.pod_problems.pop(key, None)
        for k in [k for k, obj in self.children.items() if _owner_key(obj) == key]:
            self.applied.pop(k, None)
        self._update_gauge()

    async def child_event(self, event: str, obj: dict[str, Any]) -> None:
        k = obj_key({**obj, "kind": obj.get("kind") or ""})
        owner = _owner_key(obj)
        if event == "DELETED":
            self.children.pop(k, None)
            self.applied.pop(k, None)
        else:
            self.children[k] = obj
            applied = self.applied.get(k)
            if applied is not None and _drifted(obj, applied):
                log.info("%s %s/%s changed outside the operator: restoring it", *k)
                self.applied.pop(k, None)
        if owner is not None and owner in self.known:
            self.enqueue(owner)

    async def node_event(self, event: str, node: dict[str, Any]) -> None:
        if event == "DELETED":
            changed = self.inventory.remove(node["metadata"]["name"])
        else:
            changed = self.inventory.upsert(node)
        if changed:
            # Only deployments that could not be placed are re-planned: a running deployment is
            # not moved because a node appeared.
            for key, status in self.statuses.items():
                if _condition(status, "Stalled") == "True":
                    self.enqueue(key)

    async def pod_event(self, event: str, pod: dict[str, Any]) -> None:
        """A multi-node group is one TensorRT-LLM world: when one member restarts or fails, the
        others hang in collectives, so the whole group is recreated (LeaderWorkerSet does this
        itself; this covers the StatefulSet shape)."""
        meta = pod["metadata"]
        labels = meta.get("labels", {})
        self._track_pod_problem(event, pod)
        if int(labels.get(L.GROUP_SIZE, "1")) < 2 or "leaderworkerset.sigs.k8s.io/name" in labels:
            return
        status = pod.get("status") or {}
        restarted = any(c.get("restartCount", 0) > 0 for c in status.get("containerStatuses") or [])
        # The StatefulSet controller deletes a Failed pod at once, so the failure may first be seen
        # on a pod being deleted, or only in its DELETED event: both count, once per pod.
        if not (restarted or status.get("phase") == "Failed") or meta.get("uid") in self._group_failures:
            return
        self._group_failures[meta.get("uid")] = None
        while len(self._group_failures) > 4096:
            del self._group_failures[next(iter(self._group_failures))]
        group = labels.get(L.GROUP_INDEX) or labels.get(POD_INDEX)
        deployment, pool = labels.get(L.DEPLOYMENT), labels.get(L.POOL)
        if group is None or deployment is None or pool is None:
            return
        namespace = meta["namespace"]
        key = (namespace, deployment, pool, group)
        if key in self._broken_groups:
            return
        self._broken_groups.add(key)
        try:
            log.warning(
                "pod %s/%s restarted: recreating group %s of %s", namespace, meta["name"], group, deployment
            )
            await self.kube.delete_pod(namespace, f"{names.serving(deployment, pool)}-{group}")
            workers = self.children.get(("StatefulSet", namespace, names.group(deployment, pool, int(group))))
            if workers is not None:
                start = workers["spec"].get("ordinals", {}).get("start", 0)
                for ordinal in range(start, start + workers["spec"].get("replicas", 0)):
                    await self.kube.delete_pod(namespace, f"{workers['metadata']['name']}-{ordinal}")
        finally:
            self._broken_groups.discard(key)

    def _track_pod_problem(self, event: str, pod: dict[str, Any]) -> None:
        owner = _owner_key(pod)
        if owner is None:
            return
        name = pod["metadata"]["name"]
        problem = None if event == "DELETED" else _pod_problem(pod)
        problems = self.pod_problems.setdefault(owner, {})
        if problems.get(name) == problem:
            return
        if problem is None:
            problems.pop(name, None)
        else:
            problems[name] = problem
        if owner in self.known:
            self.enqueue(owner)

    # -- the reconcile -------------------------------------------------------------------------

    async def reconcile(self, namespace: str, name: str) -> None:
        body = await self.kube.get_deployment(namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            self.forget((namespace, name))
            return
        old_status = body.get("status") or {}
        generation = int(body["metadata"].get("generation", 0))
        try:
            ld = LLMDeployment.model_validate(body)
        except ValidationError as e:
            # Admission normally prevents this (CEL mirrors the models); an object stored under an
            # older CRD can still disagree. Report it; touch nothing that runs.
            obs = Observation(
                generation, PlanningError("InvalidSpec", _first_error(e)), invalid_spec=_first_error(e)
            )
            await self._write_status(body, obs, old_status)
            return

        try:
            plan: Plan | PlanningError = self.plan(ld)
        except PlanningError as e:
            plan = e
        if isinstance(plan, PlanningError):
            # Keep whatever serves now; only status and an Event change.
            pools = self._observe_existing(namespace, name)
            obs = Observation(generation, plan, pools=pools, selector=serving_selector(name))
            await self._write_status(body, obs, old_status)
            return

        engines, engine_status = await self._engines(ld, plan)
        desired = build_children(
            ld, plan, self.config.images, engines, leader_worker_set=self.leader_worker_set
        )
        for obj in desired:
            await self._apply(obj)
        held = {p.name for p in plan.pools if not engines[p.name].ready}
        await self._prune(ld, plan, desired, held)
        obs = Observation(
            generation,
            plan,
            engines=engine_status,
            pools={p.name: self._observe_pool(ld, p) for p in plan.pools},
            selector=serving_selector(name),
            endpoints=endpoints(name, namespace),
            pod_problems=tuple(
                f"{pod}: {why}" for pod, why in sorted(self.pod_problems.get((namespace, name), {}).items())
            ),
        )
        await self._write_status(body, obs, old_status)

    def plan(self, ld: LLMDeployment) -> Plan:
        if not needs_engine(ld):
            return cpu_plan(ld.spec)
        return plan_deployment(ld.spec, self.inventory, ld.spec.replicas)

    async def _engines(
        self, ld: LLMDeployment, plan: Plan
    ) -> tuple[dict[str, PoolEngine], dict[str, PoolEngineStatus]]:
        engines: dict[str, PoolEngine] = {}
        statuses: dict[str, PoolEngineStatus] = {}
        spec = ld.spec
        for pool in plan.pools:
            if not needs_engine(ld):
                engines[pool.name] = PoolEngine(None, None, True)
                statuses[pool.name] = PoolEngineStatus(EngineState.NOT_NEEDED)
            elif spec.engine.prebuilt is not None:
                location = engine_location(spec.engine.prebuilt.uri, None)
                engines[pool.name] = PoolEngine(location, None, True)
                statuses[pool.name] = PoolEngineStatus(EngineState.READY, uri=spec.engine.prebuilt.uri)
            else:
                engines[pool.name], statuses[pool.name] = await self._built_engine(ld, pool)
        return engines, statuses

    async def _built_engine(self, ld: LLMDeployment, pool: PoolPlan) -> tuple[PoolEngine, PoolEngineStatus]:
        spec = ld.spec
        version = (
            spec.engine.build and spec.engine.build.tensorrt_llm_version
        ) or self.config.images.trtllm_version
        key = cache_key(spec, pool, version)
        location: EngineLocation = engine_location(spec.engine.cache.uri, key)
        uri = f"{spec.engine.cache.uri.rstrip('/')}/{key}"
        index = self.children.get(("ConfigMap", ld.namespace, ENGINE_INDEX))
        if index is not None and key in (index.get("data") or {}):
            return PoolEngine(location, key, True), PoolEngineStatus(EngineState.READY, key, uri)
        job_name = names.engine_job(ld.name, pool, key)
        job = self.children.get(("Job", ld.namespace, job_name))
        state = _job_state(job)
        if state == "Complete":
            await self.kube.add_configmap_keys(ld.namespace, ENGINE_INDEX, {key: now()})
            return PoolEngine(location, key, True), PoolEngineStatus(EngineState.READY, key, uri, job_name)
        if state is not None and state.startswith("Failed"):
            message = f"engine build Job {job_name} failed: {state.removeprefix('Failed:').strip()}"
            return PoolEngine(location, key, False), PoolEngineStatus(
                EngineState.FAILED, key, uri, job_name, message
            )
        desired = build_job(
            ld.name,
            ld.namespace,
            spec,
            pool,
            key,
            image=(spec.engine.build and spec.engine.build.image) or self.config.images.engine_builder,
            owner=owner_reference(ld),
        )
        await self._apply(desired)
        return PoolEngine(location, key, False), PoolEngineStatus(
            EngineState.BUILDING, key, uri, job_name, f"building engine {key} (Job {job_name})"
        )

    async def _apply(self, obj: dict[str, Any]) -> None:
        k = obj_key(obj)
        d = digest(obj)
        applied = self.applied.get(k)
        if applied is not None and applied.digest == d and k in self.children:
            return
        result = await self.kube.apply(obj)
        generation = result.get("metadata", {}).get("generation")
        self.applied[k] = Applied(d, generation, obj if generation is None else None)
        self.children[k] = result

    async def _prune(
        self, ld: LLMDeployment, plan: Plan, desired: list[dict[str, Any]], held: set[str]
    ) -> None:
        """Delete serving children this spec no longer renders (removed pools, fewer groups)."""
        keep = {obj_key(o) for o in desired}
        for k, obj in list(self.children.items()):
            kind = k[0]
            if kind == "Job" or k in keep or _owner_key(obj) != (ld.namespace, ld.name):
                continue
            pool = obj["metadata"].get("labels", {}).get(L.POOL)
            if pool in held:
                continue
            if kind == "HorizontalPodAutoscaler" and ld.spec.autoscaling is not None:
                continue
            await self.kube.delete(kind, k[1], k[2])
            self.applied.pop(k, None)

    def _observe_existing(self, namespace: str, name: str) -> dict[str, PoolObserved]:
        pools: dict[str, PoolObserved] = {}
        for k, obj in self.children.items():
            if k[0] == "StatefulSet" and _owner_key(obj) == (namespace, name):
                labels = obj["metadata"].get("labels", {})
                if labels.get(L.ROLE) == "leader":
                    st = obj.get("status") or {}
                    pools[labels.get(L.POOL, "main")] = PoolObserved(
                        desired=obj["spec"].get("replicas", 0), ready=st.get("readyReplicas", 0), exists=True
                    )
        return pools

    def _observe_pool(self, ld: LLMDeployment, pool: PoolPlan) -> PoolObserved:
        lws = self.children.get(("LeaderWorkerSet", ld.namespace, names.serving(ld.name, pool)))
        if lws is not None and pool.pods_per_replica > 1:
            st = lws.get("status") or {}
            applied = self.applied.get(obj_key(lws))
            current = applied is None or applied.generation == lws["metadata"].get("generation")
            rolled = current and st.get("updatedReplicas", 0) >= pool.replicas
            return PoolObserved(pool.replicas, st.get("readyReplicas", 0), True, rolled)
        leader = self.children.get(("StatefulSet", ld.namespace, names.serving(ld.name, pool)))
        if leader is None:
            return PoolObserved(desired=pool.replicas)
        groups = [
            self.children.get(("StatefulSet", ld.namespace, names.group(ld.name, pool, i)))
            for i in range(pool.replicas if pool.pods_per_replica > 1 else 0)
        ]
        sets = [leader, *groups]
        rolled = all(s is not None and _rolled_out(s, self.applied.get(obj_key(s))) for s in sets)
        ready = (leader.get("status") or {}).get("readyReplicas", 0)
        if groups:
            complete = sum(1 for s in groups if s is not None and _sts_ready(s))
            ready = min(ready, complete)
        return PoolObserved(desired=pool.replicas, ready=ready, exists=True, rolled_out=rolled)

    async def _write_status(self, body: dict[str, Any], obs: Observation, old: dict[str, Any]) -> None:
        status, events = reduce(obs, old, now())
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if _comparable(status) != _comparable(old):
            patch: dict[str, Any] = {k: None for k in old if k not in status}
            patch.update(status)
            await self.kube.patch_status(key[0], key[1], patch)
        stamp = now()
        for ev in events:
            await self.kube.event(body, ev.type, ev.reason, ev.message, stamp)
        self.statuses[key] = status
        self._update_gauge()

    def _update_gauge(self) -> None:
        counts: dict[tuple[str, str], int] = {}
        for status in self.statuses.values():
            for c in status.get("conditions", []):
                counts[(c["type"], c["status"])] = counts.get((c["type"], c["status"]), 0) + 1
        DEPLOYMENTS.clear()
        for (ctype, cstatus), n in counts.items():
            DEPLOYMENTS.labels(ctype, cstatus).set(n)


# -- helpers -----------------------------------------------------------------------------------


def _owner_key(obj: dict[str, Any]) -> Key | None:
    meta = obj.get("metadata", {})
    name = meta.get("labels", {}).get(L.DEPLOYMENT)
    return (meta.get("namespace", ""), name) if name else None


def _condition(status: dict[str, Any], type_: str) -> str | None:
    for c in status.get("conditions", []):
        if c.get("type") == type_:
            return str(c.get("status"))
    return None


def _comparable(status: dict[str, Any]) -> str:
    return json.dumps(status, sort_keys=True)


def _drifted(observed: dict[str, Any], applied: Applied) -> bool:
    """Did someone other than us change what we own? Spec edits bump metadata.generation;
    ConfigMaps and Services have none, so their owned content is compared."""
    if applied.generation is not None or applied.desired is None:
        return bool(observed.get("metadata", {}).get("generation") != applied.generation)
    for field in ("data", "spec"):
        if field in applied.desired and not _subset(applied.desired[field], observed.get(field)):
            return True
    return False


def _subset(want: Any, have: Any) -> bool:
    if isinstance(want, dict):
        return isinstance(have, dict) and all(_subset(v, have.get(k)) for k, v in want.items())
    if isinstance(want, list):
        return (
            isinstance(have, list)
            and len(want) == len(have)
            and all(_subset(w, h) for w, h in zip(want, have, strict=True))
        )
    return bool(want == have)


FAILING_WAIT_REASONS = {
    "ImagePullBackOff", "ErrImagePull", "InvalidImageName", "CrashLoopBackOff",
    "CreateContainerConfigError", "CreateContainerError",
}  # fmt: skip


def _pod_problem(pod: dict[str, Any]) -> str | None:
    """Why a serving pod cannot run (a waiting reason that needs a person), or None."""
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (c.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in FAILING_WAIT_REASONS:
            return f"{waiting['reason']}: {waiting.get('message', '')}".strip().rstrip(":")[:300]
    return None


def _job_state(job: dict[str, Any] | None) -> str | None:
    if job is None:
        return None
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("status") == "True" and c.get("type") == "Complete":
            return "Complete"
        if c.get("status") == "True" and c.get("type") == "Failed":
            return f"Failed: {c.get('reason', '')} {c.get('message', '')}".strip()
    return "Running"


def _sts_ready(sts: dict[str, Any]) -> bool:
    st = sts.get("status") or {}
    return bool(st.get("readyReplicas", 0) >= sts["spec"].get("replicas", 0))


def _rolled_out(sts: dict[str, Any], applied: Applied | None) -> bool:
    st = sts.get("status") or {}
    generation = sts.get("metadata", {}).get("generation")
    if applied is not None and applied.generation is not None and generation != applied.generation:
        return False
    replicas = sts["spec"].get("replicas", 0)
    return bool(
        st.get("observedGeneration") == generation
        and st.get("updatedReplicas", 0) >= replicas
        and st.get("currentRevision") == st.get("updateRevision")
    )


def _first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']}"


__all__ = ["CHILD_KINDS", "Reconciler"]
