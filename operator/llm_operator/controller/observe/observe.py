"""What the watched children and pods say about one deployment (pure: no I/O).

The reconcile reads the watch cache through these functions; the status reducer turns their
answers into conditions.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, TypeVar

from llm_operator import labels as L
from llm_operator.api.v1alpha1 import LLMDeployment
from llm_operator.controller.cluster.kube import ObjKey, obj_key
from llm_operator.controller.status.status import (
    FAILED_POD,
    LAUNCHER_REFUSED,
    MISSING_OBJECT,
    REFUSED,
    PoolObserved,
)
from llm_operator.plan.types import PoolPlan
from llm_operator.render import names
from llm_operator.rollout.revision import Slot

Key = tuple[str, str]  # namespace, name of an LLMDeployment
KT = TypeVar("KT", bound=tuple[str, ...])
Children = Mapping[ObjKey, dict[str, Any]]


@dataclass
class Applied:
    """What the operator last applied to one child."""

    digest: str
    generation: int | None  # None for kinds without metadata.generation
    desired: dict[str, Any] | None  # kept only without a generation: drift is then found by content


def owner_key(obj: dict[str, Any]) -> Key | None:
    meta = obj.get("metadata", {})
    name = meta.get("labels", {}).get(L.DEPLOYMENT)
    return (meta.get("namespace", ""), name) if name else None


class CompactDicts(MutableMapping[KT, dict[str, Any]]):
    """Objects kept as compact JSON and decoded when read: as Python dicts they take about five
    times their JSON size, which at thousands of deployments was most of the operator's memory,
    while a reconcile reads only its own few. A read returns a copy: change one by setting it."""

    def __init__(self, objs: Mapping[KT, dict[str, Any]] | None = None) -> None:
        self._objs: dict[KT, str] = {}
        self.update(objs or {})

    def __getitem__(self, k: KT) -> dict[str, Any]:
        obj: dict[str, Any] = json.loads(self._objs[k])
        return obj

    def __contains__(self, k: object) -> bool:
        return k in self._objs

    def __setitem__(self, k: KT, obj: dict[str, Any]) -> None:
        self._objs[k] = json.dumps(obj, separators=(",", ":"))

    def __delitem__(self, k: KT) -> None:
        del self._objs[k]

    def __iter__(self) -> Iterator[KT]:
        return iter(self._objs)

    def __len__(self) -> int:
        return len(self._objs)


class ChildCache(CompactDicts[ObjKey]):
    """The watch cache of our children, indexed by owning deployment: a reconcile reads its own
    children without scanning every deployment's (at 500 deployments those scans were a third
    of the operator's CPU, and they grow with N squared)."""

    def __init__(self, objs: Mapping[ObjKey, dict[str, Any]] | None = None) -> None:
        self._owners: dict[ObjKey, Key] = {}
        self._by_owner: dict[Key, set[ObjKey]] = {}
        super().__init__(objs)

    def __setitem__(self, k: ObjKey, obj: dict[str, Any]) -> None:
        self._unindex(k)
        super().__setitem__(k, obj)
        owner = owner_key(obj)
        if owner is not None:
            self._owners[k] = owner
            self._by_owner.setdefault(owner, set()).add(k)

    def __delitem__(self, k: ObjKey) -> None:
        self._unindex(k)
        super().__delitem__(k)

    def owned_by(self, owner: Key) -> list[tuple[ObjKey, dict[str, Any]]]:
        """The children labelled as the deployment's, in key order."""
        return [(k, self[k]) for k in sorted(self._by_owner.get(owner, ()))]

    def _unindex(self, k: ObjKey) -> None:
        owner = self._owners.pop(k, None)
        if owner is None:
            return
        keys = self._by_owner[owner]
        keys.discard(k)
        if not keys:
            del self._by_owner[owner]


def drifted(observed: dict[str, Any], applied: Applied) -> bool:
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


def existing_pools(children: ChildCache, namespace: str, name: str) -> dict[str, PoolObserved]:
    """What serves now, whatever the spec says: reported while the spec cannot be planned."""
    pools: dict[str, PoolObserved] = {}
    for k, obj in children.owned_by((namespace, name)):
        if k[0] == "StatefulSet":
            labels = obj["metadata"].get("labels", {})
            if labels.get(L.ROLE) == "leader":
                st = obj.get("status") or {}
                # Keyed by slot too: during a rollout both slots run the same pools.
                pools[f"{labels.get(L.POOL, 'main')}/{labels.get(L.SLOT, Slot.A.value)}"] = PoolObserved(
                    desired=obj["spec"].get("replicas", 0), ready=st.get("readyReplicas", 0), exists=True
                )
    return pools


def pool_observed(
    children: Children,
    applied: Mapping[ObjKey, Applied],
    ld: LLMDeployment,
    pool: PoolPlan,
    slot: Slot = Slot.A,
) -> PoolObserved:
    lws = children.get(("LeaderWorkerSet", ld.namespace, names.leader_worker_set(ld.name, pool, slot)))
    if lws is not None and pool.pods_per_replica > 1:
        st = lws.get("status") or {}
        ours = applied.get(obj_key(lws))
        current = ours is None or ours.generation == lws["metadata"].get("generation")
        rolled = current and st.get("updatedReplicas", 0) >= pool.replicas
        return PoolObserved(pool.replicas, st.get("readyReplicas", 0), True, rolled)
    leader = children.get(("StatefulSet", ld.namespace, names.serving(ld.name, pool, slot)))
    if leader is None:
        return PoolObserved(desired=pool.replicas)
    groups = [
        children.get(("StatefulSet", ld.namespace, names.group(ld.name, pool, i, slot)))
        for i in range(pool.replicas if pool.pods_per_replica > 1 else 0)
    ]
    sets = [leader, *groups]
    rolled = all(s is not None and rolled_out(s, applied.get(obj_key(s))) for s in sets)
    ready = (leader.get("status") or {}).get("readyReplicas", 0)
    if groups:
        complete = sum(1 for s in groups if s is not None and _sts_ready(s))
        ready = min(ready, complete)
    return PoolObserved(desired=pool.replicas, ready=ready, exists=True, rolled_out=rolled)


def _sts_ready(sts: dict[str, Any]) -> bool:
    st = sts.get("status") or {}
    return bool(st.get("readyReplicas", 0) >= sts["spec"].get("replicas", 0))


def rolled_out(sts: dict[str, Any], applied: Applied | None) -> bool:
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


MAX_PROBLEM = 500  # characters per pod: status and Events stay readable and bounded
LAUNCHER_EXIT_CONFIG = 78  # runtime/launcher.py EXIT_CONFIG (the operator does not import the runtime)


def _one_line(terminated: dict[str, Any]) -> str:
    return "; ".join(line.strip() for line in (terminated.get("message") or "").splitlines() if line.strip())


def exited(terminated: dict[str, Any], prefix: int) -> str:
    """`exited 1 (Error): <message>`, within MAX_PROBLEM after a `prefix`-long reason. The message
    (the launcher's last words, or the log's tail with FallbackToLogsOnError) ends with what
    happened last: its end is kept."""
    head = f"exited {terminated.get('exitCode')} ({terminated.get('reason', '')})"
    said = _one_line(terminated)
    room = MAX_PROBLEM - prefix - len(head) - 4
    if not said:
        return head
    return f"{head}: " + (said if len(said) <= room else "..." + said[-(room - 3) :])


FAILING_WAIT_REASONS = {
    "ImagePullBackOff", "ErrImagePull", "InvalidImageName", "CrashLoopBackOff",
    "CreateContainerConfigError", "CreateContainerError",
}  # fmt: skip


def launcher_refusal(status: dict[str, Any]) -> str | None:
    """`LauncherRefused: <the launcher's line>` when a restarting container's launcher exited
    EXIT_CONFIG: a file is missing or the environment is wrong, and no restart will change that.
    Its message is the line our launcher wrote from paths and variable names (runtime/preflight.py),
    never the user's values; it is still bounded."""
    if status.get("phase") in ("Failed", "Succeeded"):  # build attempts: their Job reports them
        return None
    for c in status.get("containerStatuses") or []:
        if "running" in (c.get("state") or {}):
            continue  # started again, past the checks (the files are there now) or about to fail anew
        for state in (c.get("state"), c.get("lastState")):
            ended = (state or {}).get("terminated") or {}
            if ended.get("exitCode") == LAUNCHER_EXIT_CONFIG:
                return f"{LAUNCHER_REFUSED}: {_one_line(ended) or 'exited 78'}"[:MAX_PROBLEM]
    return None


def pod_problem(pod: dict[str, Any]) -> str | None:
    """Why a serving or build pod cannot run, in the cluster's words (a waiting reason that needs a
    person, the crashed container's last message, the scheduler's), or None."""
    status = pod.get("status") or {}
    refused = launcher_refusal(status)
    if refused is not None:
        return refused
    # Init containers first: they run before the rest (build Jobs' fetch and build steps, the
    # injection into NVIDIA's images), and theirs is the failure that stops the pod.
    containers = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    for c in containers:
        waiting = (c.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason not in FAILING_WAIT_REASONS:
            continue
        detail = waiting.get("message", "")
        last = (c.get("lastState") or {}).get("terminated") or {}
        if reason == "CrashLoopBackOff" and last:
            detail = exited(last, len(reason))
        return f"{reason}: {detail}".strip().rstrip(":")[:MAX_PROBLEM]
    if status.get("phase") == "Failed":  # a build attempt (restartPolicy Never) that ended badly
        for c in containers:
            ended = (c.get("state") or {}).get("terminated") or {}
            if ended.get("exitCode"):
                return f"{FAILED_POD}: {exited(ended, len(FAILED_POD))}"
    if status.get("phase") == "Pending":
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("reason") == "Unschedulable":
                return f"Unschedulable: {cond.get('message', '')}".strip().rstrip(":")[:MAX_PROBLEM]
    return None


def unplaced_since(pod: dict[str, Any], problem: str) -> str | None:
    """When the scheduler first failed to place a pod that names no missing object: capacity may
    yet free up or be added, so this is a wait until status.UNPLACED_GRACE_SECONDS pass."""
    if not problem.startswith("Unschedulable") or MISSING_OBJECT.search(problem):
        return None
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled":
            return cond.get("lastTransitionTime") or None
    return None


class PodProblems:
    """Per deployment, its serving pods that cannot run and why, kept from the pod watch."""

    def __init__(self) -> None:
        # pod -> (why, pending since: None once a person must act, its slot)
        self._by_owner: dict[Key, dict[str, tuple[str, str | None, Slot]]] = {}

    def update(self, event: str, pod: dict[str, Any]) -> Key | None:
        """Record what the pod says; the owning deployment when that changed anything."""
        owner = owner_key(pod)
        if owner is None:
            return None
        name = pod["metadata"]["name"]
        problem = None if event == "DELETED" else pod_problem(pod)
        slot = Slot((pod["metadata"].get("labels") or {}).get(L.SLOT, Slot.A.value))
        seen = None if problem is None else (problem, unplaced_since(pod, problem), slot)
        problems = self._by_owner.setdefault(owner, {})
        if problems.get(name) == seen:
            return None
        if seen is None:
            problems.pop(name, None)
        else:
            problems[name] = seen
        return owner

    def of(self, key: Key) -> tuple[str, ...]:
        """`pod: why` of the pods that need a person."""
        found = sorted(self._by_owner.get(key, {}).items())
        return tuple(f"{pod}: {why}" for pod, (why, since, _) in found if since is None)

    def unplaced(self, key: Key) -> tuple[tuple[str, str], ...]:
        """(`pod: Unschedulable: why`, since) of the pods the scheduler may yet place."""
        found = sorted(self._by_owner.get(key, {}).items())
        return tuple((f"{pod}: {why}", since) for pod, (why, since, _) in found if since is not None)

    def by_slot(self, key: Key) -> dict[Slot, tuple[str, ...]]:
        """`pod: why` of every pod that cannot run, pending ones too, per slot."""
        out: dict[Slot, tuple[str, ...]] = {}
        for pod, (why, _, slot) in sorted(self._by_owner.get(key, {}).items()):
            out[slot] = (*out.get(slot, ()), f"{pod}: {why}")
        return out

    def forget(self, key: Key) -> None:
        self._by_owner.pop(key, None)


@dataclass(frozen=True)
class CreateFailure:
    uid: str  # of the StatefulSet or Job the Event names: a recreated one starts clean
    message: str


def create_failure(event: dict[str, Any]) -> tuple[ObjKey, CreateFailure] | None:
    """A StatefulSet or Job controller's FailedCreate Event: Pod Security, a quota or a webhook
    refused the pod, so no pod exists to report anything. The Event is all the cluster says."""
    involved = event.get("involvedObject") or {}
    kind = involved.get("kind")
    if event.get("reason") != REFUSED or kind not in ("StatefulSet", "Job"):
        return None
    key = (kind, involved.get("namespace", ""), involved.get("name", ""))
    return key, CreateFailure(involved.get("uid", ""), event.get("message", ""))


def still_refused(child: dict[str, Any], failure: CreateFailure) -> bool:
    """Until the controller has created every pod it wants, the last refusal stands."""
    if child["metadata"].get("uid") != failure.uid:
        return False
    status = child.get("status") or {}
    if child.get("kind") == "StatefulSet":
        return bool(status.get("replicas", 0) < child.get("spec", {}).get("replicas", 1))
    finished = any(c.get("status") == "True" for c in status.get("conditions") or [])
    return not (finished or status.get("active") or status.get("succeeded") or status.get("failed"))


class CreateFailures:
    """Per StatefulSet or Job of ours, the last pod the API server refused it, from the Events."""

    def __init__(self) -> None:
        self._by_child: dict[ObjKey, CreateFailure] = {}

    def update(self, event: str, obj: dict[str, Any], children: Children) -> Key | None:
        """Record a FailedCreate Event; the owning deployment when that changed anything."""
        found = create_failure(obj)
        if found is None or event == "DELETED":  # an Event's TTL ending says nothing of the pod
            return None
        key, failure = found
        if self._by_child.get(key) == failure:
            return None
        self._by_child[key] = failure
        child = children.get(key)
        return owner_key(child) if child is not None else None

    def of(self, children: Children, owner: Key) -> tuple[str, ...]:
        """`<object>: FailedCreate: <the controller's words>` for each that still lacks pods."""
        problems = []
        for key, failure in list(self._by_child.items()):
            child = children.get(key)
            if child is None or not still_refused(child, failure):
                del self._by_child[key]  # created since, or gone: a later refusal is a new Event
            elif owner_key(child) == owner:
                problems.append(f"{key[2]}: {REFUSED}: {failure.message}"[:MAX_PROBLEM])
        return tuple(sorted(problems))
