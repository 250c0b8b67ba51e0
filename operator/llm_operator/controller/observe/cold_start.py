"""Cold starts measured from the pod watch: what the API server says about each serving pod, no
clock of the operator's own (the measure is pure; ColdStarts keeps what the watch brought).

A pod's start runs from its creationTimestamp to its Ready condition, in phases each ending at a
moment the pod's status records:

- scheduled: the PodScheduled condition (the scheduler's wait, a GPU node being added);
- initialized: the last init container's end (pulling the launcher image and copying in the
  launcher), or the Initialized condition where there is none;
- started: the serving container's state.running.startedAt, which the kubelet sets once it has
  pulled the container's image and started it: the image pull is in this phase;
- ready: the Ready condition (the launcher's checks, Triton loading the model, the probes).

Only a start from nothing is measured: a pod whose containers all have restartCount 0, Ready and
not being deleted; a container restarted in place keeps its pod and is not a cold start. For a
multi-node group the replica starts when its last member is Ready: the start reported is that
slowest member's, once every member of the group is Ready.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from llm_operator import labels as L
from llm_operator.controller.observe.observe import Key, owner_key
from llm_operator.controller.status.cold_start import PHASES, ColdStart, phases
from llm_operator.render.serving import LWS_GROUP_INDEX, POD_INDEX


@dataclass(frozen=True)
class PodStart:
    name: str
    uid: str
    created: str
    ready: str
    phases: tuple[tuple[str, int], ...]
    seen_starting: bool = False  # the watch showed it before it was Ready


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any] | None:
    found = [c for c in status.get("conditions") or [] if c.get("type") == kind and c.get("status") == "True"]
    return found[0] if found else None


def measure(pod: dict[str, Any]) -> PodStart | None:
    """The pod's start, once it is Ready; None before that, or for a pod restarted in place."""
    meta, status = pod["metadata"], pod.get("status") or {}
    ready, scheduled = _condition(status, "Ready"), _condition(status, "PodScheduled")
    containers = status.get("containerStatuses") or []
    inits = status.get("initContainerStatuses") or []
    if meta.get("deletionTimestamp") or ready is None or scheduled is None or not containers:
        return None
    if any(c.get("restartCount", 0) for c in [*containers, *inits]):
        return None
    running: list[str | None] = [
        ((c.get("state") or {}).get("running") or {}).get("startedAt") for c in containers
    ]
    started = max(filter(None, running), default=None)
    if started is None or not all(running):
        return None
    ended = [((c.get("state") or {}).get("terminated") or {}).get("finishedAt") for c in inits]
    # A sidecar (restartPolicy Always) init container runs on: its start is its end here.
    ended += [((c.get("state") or {}).get("running") or {}).get("startedAt") for c in inits]
    initialized = max(filter(None, ended), default=None)
    if initialized is None:
        initialized = (_condition(status, "Initialized") or {}).get("lastTransitionTime")
    created = meta["creationTimestamp"]
    ready_at = ready.get("lastTransitionTime") or created
    moments = [scheduled.get("lastTransitionTime"), initialized, started, ready_at]
    measured = phases(list(zip(PHASES, moments, strict=True)), created)
    return PodStart(meta["name"], meta.get("uid", ""), created, ready_at, measured)


Replica = tuple[str, str, str]  # slot, pool, group index (a single-pod replica: its pod's name)


def replica_of(pod: dict[str, Any]) -> tuple[Replica, int] | None:
    """Which replica a serving pod belongs to, and how many pods that replica has."""
    labels = pod["metadata"].get("labels") or {}
    if labels.get(L.ROLE) not in ("leader", "worker"):
        return None  # a fetch or build pod
    size = int(labels.get(L.GROUP_SIZE, "1"))
    if size < 2:
        return (labels.get(L.SLOT, "a"), labels.get(L.POOL, ""), pod["metadata"]["name"]), 1
    # LWS labels every pod of a group with its index (its worker pods' pod-index is their rank);
    # our StatefulSet shape, the leader by its pod-index and the workers by the group label.
    index = labels.get(LWS_GROUP_INDEX) or labels.get(L.GROUP_INDEX) or labels.get(POD_INDEX)
    if index is None:
        return None
    return (labels.get(L.SLOT, "a"), labels.get(L.POOL, ""), index), size


def replica_start(members: list[PodStart], size: int, replica: Replica) -> ColdStart | None:
    """The replica's start once all `size` of its pods are Ready: its slowest member's."""
    if len(members) < size:
        return None
    slowest = max(members, key=lambda m: (m.ready, m.name))
    key = ",".join(sorted(m.uid for m in members))
    group = f"group {replica[2]} of pool {replica[1]}" if size > 1 else ""
    seen = slowest.seen_starting  # the replica became Ready while this operator watched
    return ColdStart(key, slowest.name, size, slowest.created, slowest.ready, slowest.phases, group, seen)


@dataclass
class _Pod:
    replica: Replica
    size: int
    uid: str
    start: PodStart | None = None
    reported: str = ""  # the key of the last start reported with this pod as its slowest member


class ColdStarts:
    """Per deployment, its serving pods' measured starts (from the pod watch) and which of them
    have been reported, kept with the pods and gone with them. A start is measured once, when first
    seen Ready: a later readiness flap moves the Ready condition but is not a new start. One seen
    starting (not Ready yet) by this operator is new to any status; one first seen Ready may be its
    predecessor's (status/cold_start.py)."""

    def __init__(self) -> None:
        self._pods: dict[Key, dict[str, _Pod]] = {}

    def update(self, event: str, pod: dict[str, Any]) -> Key | None:
        """Record what the pod says; its deployment when a replica's start is newly measured."""
        owner, found = owner_key(pod), replica_of(pod)
        if owner is None or found is None:
            return None
        pods = self._pods.setdefault(owner, {})
        name, uid = pod["metadata"]["name"], pod["metadata"].get("uid", "")
        if event == "DELETED" or pod["metadata"].get("deletionTimestamp"):
            pods.pop(name, None)
            return None
        seen = pods.get(name)
        if seen is not None and seen.uid == uid and seen.start is not None:
            return None  # measured already
        # Seen before under this uid without a start: not Ready then, so it started under our watch.
        starting = seen is not None and seen.uid == uid
        if not starting:
            seen = pods[name] = _Pod(*found, uid)
        start = measure(pod)
        if start is None or seen is None:
            return None
        seen.start = replace(start, seen_starting=starting)
        return owner

    def pending(self, key: Key) -> tuple[ColdStart, ...]:
        """The replicas' starts measured and not yet reported."""
        pods = self._pods.get(key, {})
        by_replica: dict[Replica, tuple[int, list[PodStart]]] = {}
        for p in pods.values():
            members = by_replica.setdefault(p.replica, (p.size, []))[1]
            if p.start is not None:
                members.append(p.start)
        starts = [replica_start(members, size, replica) for replica, (size, members) in by_replica.items()]
        return tuple(s for s in starts if s is not None and pods[s.pod].reported != s.key)

    def reported(self, key: Key, starts: tuple[ColdStart, ...]) -> None:
        pods = self._pods.get(key, {})
        for start in starts:
            if start.pod in pods:
                pods[start.pod].reported = start.key

    def forget(self, key: Key) -> None:
        self._pods.pop(key, None)
