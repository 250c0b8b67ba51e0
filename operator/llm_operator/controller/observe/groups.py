"""Multi-node groups: one member fails, the whole group serves again only as a whole.

A group is one TensorRT-LLM world, and only its leader serves, a world it launched whole. When one
member fails the others end with the world, the leader's container among them, and the kubelet
restarts it in place: its launcher starts every rank anew through the workers' launch agents
(docs/architecture.md, "A broken group restarts its world in place"). The pod watch records the
broken group here and the next reconcile says which member failed and why (a Warning Event,
GroupRecreated). The operator deletes pods only of a group that never formed (below); a
LeaderWorkerSet recreates its group itself
(restartPolicy RecreateGroupOnPodRestart: a restarted or deleted member makes LWS delete the
leader pod, and with it the group's worker StatefulSet; kubernetes-sigs/lws v0.9.0
pkg/controllers/pod_controller.go handleRestartPolicy).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from llm_operator import labels as L
from llm_operator.controller.cluster.kube import KubeApi
from llm_operator.controller.observe.observe import Children, Key, exited
from llm_operator.render import names
from llm_operator.render.serving import LWS_GROUP_INDEX, POD_INDEX
from llm_operator.rollout.revision import Slot

log = logging.getLogger(__name__)
Group = tuple[str, int, Slot]  # pool, group index, slot
_SEEN_LIMIT = 4096  # failures remembered (pod uid and its container's run) so each is acted on once
GROUP_RECREATED = "GroupRecreated"  # the Event; its length is the room exited() leaves
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"  # on every pod of a LeaderWorkerSet, set by LWS
# runtime/launcher.py EXIT_WORKERS_UNREACHABLE (the operator does not import the runtime): a leader
# whose workers never answered. Its group never formed, a worker Pending where no node fits it beside
# its leader (no gang scheduling: docs/placement.md) or cut off: relaunching in place would wait
# there again, so the group's pods are deleted and placed anew, at once (nothing formed to drain).
LAUNCHER_EXIT_WORKERS_UNREACHABLE = 69
UNFORMED_GROUP_GRACE_SECONDS = 1


@dataclass(frozen=True)
class Failure:
    pod: str  # the member whose failure broke the group (the first seen)
    why: str  # in its container's words: exit status, reason, the launcher's last lines
    leader_worker_set: str | None = None  # the LWS that recreates the group; None: its leader relaunches
    unformed: bool = False  # its leader's workers never answered: the pods are placed anew


def _latest_end(status: dict[str, Any]) -> dict[str, Any] | None:
    """The latest end of the member's container: its state when it has just ended (waiting out the
    kubelet's restart back-off), else the last end of a restarted one."""
    for c in status.get("containerStatuses") or []:
        ended = (c.get("state") or {}).get("terminated")
        if not ended and c.get("restartCount"):
            ended = (c.get("lastState") or {}).get("terminated")
        if ended:
            return dict(ended)
    return None


def why_failed(status: dict[str, Any]) -> str:
    """The failed member's own words: the pod's when it failed as a pod (an eviction, a node
    shutdown), else its container's latest end (the launcher's termination message names, for a
    leader, what mpirun lost), else the pod's phase."""
    ended = _latest_end(status)
    if ended and not (status.get("phase") == "Failed" and status.get("reason")):
        return exited(ended, len(GROUP_RECREATED))
    return f"{status.get('reason') or status.get('phase')}: {status.get('message', '')}".rstrip(": ")


def _ended_by_its_deletion(pod: dict[str, Any]) -> bool:
    """A member whose pod is being deleted and that did not fail as a pod (an eviction, a node
    shutdown: the pod's own reason) ended because it was asked to: a StatefulSet pod's container
    that fails otherwise is restarted in place, and was seen failing then. Its exit status says
    nothing (a leader whose worker, deleted with it, ended the world first exits 1 before its own
    SIGTERM comes); if its world breaks, the members that stay fail and say so. So neither a
    scaled-away or removed group's members, nor a replacement deleted before it ran, nor a deleted
    leader (its StatefulSet replaces it; its workers relaunch under the new one) is a group failure.

    A LeaderWorkerSet deletes its group's leader as soon as a member restarts or is deleted
    (RecreateGroupOnPodRestart; kubernetes-sigs/lws v0.9.0 pkg/controllers/pod_controller.go with
    pkg/utils/pod ContainerRestarted, PodDeleted): that leader, ending with the world the other
    member broke, is the one that says so. There only a pod deleted before it ran broke nothing;
    a group scaled away or removed is told apart by `wanted`."""
    status = pod.get("status") or {}
    if not pod["metadata"].get("deletionTimestamp") or status.get("reason"):
        return False
    if LWS_NAME in pod["metadata"].get("labels", {}):
        return not any(
            {"running", "terminated"} & set(c.get("state") or {})
            or (c.get("lastState") or {}).get("terminated")
            for c in status.get("containerStatuses") or []
        )
    return True


def _utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")  # as the API server writes times


class GroupFailures:
    """Failed members, one event per broken world. `began`: when this operator began watching
    (RFC 3339); an end before it was the previous operator's to report (pods outlive their
    failures, and each start lists them all again)."""

    def __init__(self, began: str | None = None) -> None:
        self._began = began or _utc_now()
        self._broken: dict[Key, dict[Group, Failure]] = {}
        self._seen: dict[str, None] = {}
        # When each group's world last broke: the earliest end of its event's failures (RFC 3339,
        # as the kubelets stamp them). A failed run that started before then belonged to that world
        # (a leader ending after its lost worker); one started after it broke the relaunched world,
        # a new event.
        self._since: dict[Key, dict[Group, str]] = {}

    def _mark(self, failure: str) -> None:
        self._seen[failure] = None
        while len(self._seen) > _SEEN_LIMIT:
            del self._seen[next(iter(self._seen))]

    def update(self, event: str, pod: dict[str, Any]) -> Key | None:
        """Record a failed member of a group; its deployment when new. Every event counts the same
        (a failure may first be seen in a DELETED one)."""
        meta = pod["metadata"]
        labels = meta.get("labels", {})
        if int(labels.get(L.GROUP_SIZE, "1")) < 2:
            return None
        lws = labels.get(LWS_NAME)
        # An LWS worker's pod-index is its rank in the group, not the group's index.
        index = labels.get(LWS_GROUP_INDEX) if lws else labels.get(L.GROUP_INDEX) or labels.get(POD_INDEX)
        deployment, pool = labels.get(L.DEPLOYMENT), labels.get(L.POOL)
        if index is None or deployment is None or pool is None or not index.isdigit():
            return None
        key = (meta["namespace"], deployment)
        slot = Slot.B if labels.get(L.SLOT) == Slot.B else Slot.A  # none: an operator before slots
        group = (pool, int(index), slot)
        status = pod.get("status") or {}
        ended, failed_pod = _latest_end(status) or {}, status.get("phase") == "Failed"
        # Each failure once: a run by its container (it stays the latest end while the kubelet
        # backs off, then moves to lastState), a pod's own failure apart. The StatefulSet
        # controller deletes a Failed pod (evicted, its node shut down) at once, so the failure may
        # first be seen on a pod being deleted, or only in its DELETED event: both count.
        run = ended.get("containerID") or ended.get("finishedAt") or ""
        failure = f"{meta.get('uid', '')}/{run}/{'Failed' if failed_pod else ''}"
        if not (ended or failed_pod) or failure in self._seen or _ended_by_its_deletion(pod):
            return None
        self._mark(failure)
        finished = str(ended.get("finishedAt") or "")
        if finished and finished < self._began and not failed_pod:
            return None  # reported by the operator that watched it end
        # A run that never started (a StartError's is stamped 1970) tells nothing of its world.
        started = str(ended.get("startedAt") or "")
        if started < str(meta.get("creationTimestamp") or ""):
            started = ""
        unformed = ended.get("exitCode") == LAUNCHER_EXIT_WORKERS_UNREACHABLE  # the leader's own run
        since = self._since.setdefault(key, {})
        if group in since and started and started < since[group] and not unformed:
            since[group] = min(since[group], finished or since[group])
            return None  # it ran in the world whose end is already reported
        if finished:  # a member that never ran broke no world
            pending = group in self._broken.get(key, {}) and group in since
            since[group] = min(since[group], finished) if pending else finished
        self._broken.setdefault(key, {}).setdefault(
            group, Failure(meta["name"], why_failed(status), lws, unformed)
        )
        return key

    def take(self, key: Key) -> list[tuple[Group, Failure]]:
        """The broken groups to report, once each."""
        return sorted(self._broken.pop(key, {}).items())

    def forget(self, key: Key) -> None:
        self._broken.pop(key, None)
        self._since.pop(key, None)


def group_pods(children: Children, namespace: str, deployment: str, group: Group) -> list[str]:
    """Every pod of one group: pod `group` of the leader StatefulSet and its worker StatefulSet's."""
    pool, index, slot = group
    pods = [f"{names.serving(deployment, pool, slot)}-{index}"]
    workers = children.get(("StatefulSet", namespace, names.group(deployment, pool, index, slot)))
    if workers is not None:
        start = workers["spec"].get("ordinals", {}).get("start", 0)
        name = workers["metadata"]["name"]
        pods += [f"{name}-{ordinal}" for ordinal in range(start, start + workers["spec"].get("replicas", 0))]
    return pods


def wanted(children: Children, namespace: str, deployment: str, group: Group, lws: str | None) -> bool:
    """Whether the deployment still runs `group`: one scaled away (its index at or past its leader
    StatefulSet's or LeaderWorkerSet's replicas) or of a slot removed (an aborted canary's, the
    replaced stable's: its leader set deleted or gone) is ending on purpose, and a member that ends
    Failed meanwhile (a leader whose world lost its worker first) broke nothing: reporting it
    would name a group that is gone (and placing it anew would cut the leader's drain short)."""
    pool, index, slot = group
    leader = ("StatefulSet", namespace, names.serving(deployment, pool, slot))
    obj = children.get(("LeaderWorkerSet", namespace, lws) if lws else leader)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        return False
    return index < int(obj["spec"].get("replicas", 0))


async def report(kube: KubeApi, children: Children, body: dict[str, Any], group: Group, failure: Failure,
                 now: str) -> None:  # fmt: skip
    """Say which member broke the group, why, and what serves again as a whole; nothing for a
    group being removed. Its leader relaunches every rank (or LWS recreates the group's pods); the
    pods of a group that never formed are deleted, to be placed anew."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    pool, index, _ = group
    lws = failure.leader_worker_set
    if not wanted(children, namespace, name, group, lws):
        log.info("%s/%s: %s ended (%s) with group %d of pool %s, which is being removed: nothing to report",
                 namespace, name, failure.pod, failure.why, index, pool)  # fmt: skip
        return
    if lws is not None:
        pods = lws_group_pods(children, namespace, lws, index)
        how = f"LeaderWorkerSet {lws} recreates group {index} of pool {pool} as a whole"
    elif failure.unformed:
        pods = group_pods(children, namespace, name, group)
        how = f"placing group {index} of pool {pool} anew, its pods deleted"
    else:
        pods = group_pods(children, namespace, name, group)
        how = f"group {index} of pool {pool} restarts as a whole, its leader relaunching every rank"
    words = f"{failure.pod} failed ({failure.why}): {how} ({', '.join(pods)})"
    log.warning("%s/%s: %s", namespace, name, words)
    for pod in pods if lws is None and failure.unformed else ():
        await kube.delete_pod(namespace, pod, UNFORMED_GROUP_GRACE_SECONDS)
    await kube.event(body, "Warning", GROUP_RECREATED, words, now)


async def report_broken(kube: KubeApi, children: Children, failures: GroupFailures, body: dict[str, Any],
                        now: str) -> bool:  # fmt: skip
    """Report the deployment's broken groups; whether any group was broken."""
    broken = failures.take((body["metadata"]["namespace"], body["metadata"]["name"]))
    for group, failure in broken:
        await report(kube, children, body, group, failure, now)
    return bool(broken)


def lws_group_pods(children: Children, namespace: str, lws: str, index: int) -> list[str]:
    """The pods of group `index` of a LeaderWorkerSet: `<lws>-<index>`, the leader, and
    `<lws>-<index>-<worker>` for its workers 1..size-1 (LWS's leader and worker StatefulSets)."""
    obj = children.get(("LeaderWorkerSet", namespace, lws)) or {}
    size = int(((obj.get("spec") or {}).get("leaderWorkerTemplate") or {}).get("size", 1))
    return [f"{lws}-{index}", *(f"{lws}-{index}-{worker}" for worker in range(1, size))]
