"""Rollouts in the reconcile: what each slot runs, read from the cluster and decided by the pure
state machine (rollout/machine.py), with the canary's analysis measured on Prometheus when due.

The reconcile asks `Rollouts.decide` once per pass. It reads the LLMDeployment's own status
(every timer lives there), the slots' ready pods (with gateway-api: ready as the revision
Services' EndpointSlices say, what the gateway routes to), the revision snapshots, the HTTPRoute's
acceptance and the user's action annotation; it returns the decision and, per slot, the spec and
images to render (the stable slot from its snapshot, the canary from the current spec).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from llm_operator import labels as L
from llm_operator.api.v1alpha1 import (
    GROUP,
    CanaryAnalysis,
    LLMDeployment,
    RolloutStrategy,
    TrafficRouting,
)
from llm_operator.controller.cluster.kube import ObjKey
from llm_operator.controller.observe.observe import ChildCache, Key, owner_key
from llm_operator.controller.rollout.prometheus_urls import Endpoint, analysis_endpoint
from llm_operator.images import Images
from llm_operator.plan.types import PlanningError
from llm_operator.render import names
from llm_operator.render.rollout import (
    SNAPSHOT_COMPONENT,
    controller_revision,
    for_slot,
    http_route,
    images_from_snapshot,
    revision_services,
    spec_from_snapshot,
)
from llm_operator.rollout import machine
from llm_operator.rollout.revision import revision_of
from llm_operator.rollout.types import Decision, Measurement, Slot, SlotObserved

log = logging.getLogger(__name__)

ACTION_ANNOTATION = f"{GROUP}/rollout-action"

# (url, analysis, namespace, deployment, revision) -> one window of every bounded metric
# (Prometheus URL, analysis, namespace, deployment, revision, the model clients call)
Measure = Callable[[str, CanaryAnalysis, str, str, str], Awaitable[list[Measurement]]]


@dataclass(frozen=True)
class SlotSpec:
    """One slot to render: the deployment running that slot's revision at its replica count."""

    slot: Slot
    revision: str
    ld: LLMDeployment
    images: Images


@dataclass(frozen=True)
class Rollout:
    decision: Decision
    revision: str  # the current spec's
    slots: list[SlotSpec]  # the current spec's slot first
    objects: list[dict[str, Any]]  # snapshots, revision Services, the HTTPRoute
    route_problem: str | None  # the gateway does not accept the HTTPRoute: its own words


class ReadyPods:
    """Per deployment, its Ready leader pods by (slot, revision), kept from the pod watch: the
    stable slot may shrink only by canary pods that run the canary's revision and are Ready."""

    def __init__(self) -> None:
        self._by_owner: dict[Key, dict[str, tuple[str, str]]] = {}

    def update(self, event: str, pod: dict[str, Any]) -> Key | None:
        owner = owner_key(pod)
        if owner is None:
            return None
        meta = pod["metadata"]
        labels = meta.get("labels") or {}
        ready = (
            event != "DELETED"
            and not meta.get("deletionTimestamp")
            and labels.get(L.ROLE) == "leader"
            and any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (pod.get("status") or {}).get("conditions") or []
            )
        )
        pods = self._by_owner.setdefault(owner, {})
        now = (labels.get(L.SLOT, Slot.A.value), labels.get(L.REVISION, "")) if ready else None
        if pods.get(meta["name"]) == now:
            return None
        if now is None:
            pods.pop(meta["name"], None)
        else:
            pods[meta["name"]] = now
        return owner

    def count(self, key: Key, slot: Slot, revision: str | None) -> int:
        return sum(1 for s, r in self._by_owner.get(key, {}).values() if s == slot.value and r == revision)

    def forget(self, key: Key) -> None:
        self._by_owner.pop(key, None)


class RoutableEndpoints:
    """Per deployment, the ready addresses behind its revision Services, by revision, from their
    EndpointSlices: what a gateway balances over. A Ready pod is not yet routable: the
    EndpointSlice controller and then the gateway follow it, each with a lag, and a backend given
    weight before its addresses reach the gateway answers 503."""

    def __init__(self) -> None:
        self._by_owner: dict[Key, dict[str, tuple[str, frozenset[str]]]] = {}

    def update(self, event: str, endpoint_slice: dict[str, Any]) -> Key | None:
        owner = owner_key(endpoint_slice)
        if owner is None:
            return None
        meta = endpoint_slice["metadata"]
        addresses: frozenset[str] = frozenset()
        if event != "DELETED":
            addresses = frozenset(
                address
                for endpoint in endpoint_slice.get("endpoints") or []
                if (endpoint.get("conditions") or {}).get("ready") is True  # as gateways read it
                for address in endpoint.get("addresses") or []
            )
        now = ((meta.get("labels") or {}).get(L.REVISION, ""), addresses) if addresses else None
        slices = self._by_owner.setdefault(owner, {})
        if slices.get(meta["name"]) == now:
            return None
        if now is None:
            slices.pop(meta["name"], None)
        else:
            slices[meta["name"]] = now
        return owner

    def count(self, key: Key, revision: str | None) -> int:
        """Distinct ready addresses of `revision` (both revision Services may select it)."""
        slices = self._by_owner.get(key, {}).values()
        return len(frozenset().union(*(addresses for r, addresses in slices if r == revision)))

    def forget(self, key: Key) -> None:
        self._by_owner.pop(key, None)


def observe_slots(
    children: ChildCache, ld: LLMDeployment, ready: ReadyPods, routable: RoutableEndpoints | None = None
) -> dict[Slot, SlotObserved]:
    """Each slot's leader workloads: the revision their pod template runs, replicas, Ready pods
    (with `routable`: no more than the revision's Services have ready addresses). Ready pods count
    no further than the workloads' own status: the pod's event comes first, and a count ahead of
    the readyReplicas that Ready is judged by would cost a status write of its own."""
    found: dict[Slot, tuple[str | None, int]] = {}
    reported: dict[Slot, int] = {}
    for (kind, _, _), obj in children.owned_by((ld.namespace, ld.name)):
        if kind not in ("StatefulSet", "LeaderWorkerSet"):
            continue
        labels = obj["metadata"].get("labels") or {}
        if labels.get(L.ROLE, "leader") != "leader":
            continue
        slot = Slot(labels.get(L.SLOT, Slot.A.value))
        template = (((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels") or {}
        if kind == "LeaderWorkerSet":
            template = (
                (
                    ((obj["spec"].get("leaderWorkerTemplate") or {}).get("leaderTemplate") or {}).get(
                        "metadata"
                    )
                )
                or {}
            ).get("labels") or {}
        revision, replicas = found.get(slot, (None, 0))
        found[slot] = (template.get(L.REVISION) or revision, replicas + int(obj["spec"].get("replicas") or 0))
        reported[slot] = reported.get(slot, 0) + int((obj.get("status") or {}).get("readyReplicas") or 0)
    key = (ld.namespace, ld.name)

    def ready_count(slot: Slot, revision: str | None) -> int:
        pods = min(ready.count(key, slot, revision), reported[slot])
        return pods if routable is None else min(pods, routable.count(key, revision))

    return {
        slot: SlotObserved(revision, replicas, ready_count(slot, revision), True)
        for slot, (revision, replicas) in found.items()
    }


def snapshots(children: ChildCache, ld: LLMDeployment) -> dict[str, dict[str, Any]]:
    """Revision -> the ControllerRevision that keeps its spec."""
    out = {}
    for (kind, _, _), obj in children.owned_by((ld.namespace, ld.name)):
        if kind == "ControllerRevision":
            labels = obj["metadata"].get("labels") or {}
            revision = labels.get(L.REVISION)
            # The StatefulSet controller's own ControllerRevisions carry our pod labels too.
            if revision and labels.get(L.COMPONENT) == SNAPSHOT_COMPONENT:
                out[revision] = obj
    return out


ROUTE_GRACE_SECONDS = 30  # a gateway controller answers within seconds; silence means no gateway
# A gateway may look for a new Service's EndpointSlices before the EndpointSlice controller has
# created them: for a moment that is a BackendNotFound, not a problem to report.
SETTLING_REASONS = ("BackendNotFound",)


def route_state(
    children: Mapping[ObjKey, dict[str, Any]], ld: LLMDeployment, now: datetime
) -> tuple[bool, str | None]:
    """(accepted, the gateway's words when it refuses) of the deployment's HTTPRoute: a backend
    gets weight only through a route every parent accepted at its current generation (an answer
    about an earlier one says nothing of the weights now asked for). A parent nobody answers for
    (no Gateway of that name, or no controller running it) gets no status at all, by the Gateway
    API's rules: after ROUTE_GRACE_SECONDS that silence is the problem reported."""
    route = children.get(("HTTPRoute", ld.namespace, names.http_route(ld.name)))
    if route is None:
        return False, None
    name, generation = route["metadata"]["name"], route["metadata"].get("generation")
    parents = (route.get("status") or {}).get("parents") or []
    accepted = 0
    for ref in (route.get("spec") or {}).get("parentRefs") or []:
        where = f"{ref.get('namespace', ld.namespace)}/{ref.get('name')}"
        where += f" (listener {ref['sectionName']})" if ref.get("sectionName") else ""
        answer = next((p for p in parents if _same_parent(p.get("parentRef") or {}, ref, ld.namespace)), None)
        if answer is None:
            created = datetime.fromisoformat(route["metadata"].get("creationTimestamp") or now.isoformat())
            if (now - created).total_seconds() > ROUTE_GRACE_SECONDS:
                return False, (
                    f"HTTPRoute {name}: no gateway has answered for parent {where} in "
                    f"{ROUTE_GRACE_SECONDS} s: check that the Gateway exists and that its controller runs"
                )
            continue
        current = [
            c for c in answer.get("conditions") or [] if c.get("observedGeneration") in (None, generation)
        ]
        settling = False
        for cond in current:
            if cond.get("type") in ("Accepted", "ResolvedRefs") and cond.get("status") == "False":
                if cond.get("reason") in SETTLING_REASONS and _age(cond, now) <= ROUTE_GRACE_SECONDS:
                    settling = True
                    continue
                words = cond.get("message") or "no message"
                return (
                    False,
                    f"HTTPRoute {name} on {where}: {cond.get('type')}=False, {cond.get('reason')}: {words}",
                )
        accepted += not settling and any(
            c.get("type") == "Accepted" and c.get("status") == "True" for c in current
        )
    return accepted > 0 and accepted == len((route.get("spec") or {}).get("parentRefs") or []), None


def _age(condition: dict[str, Any], now: datetime) -> float:
    since = condition.get("lastTransitionTime")
    return (now - datetime.fromisoformat(since)).total_seconds() if since else 0.0


def _same_parent(seen: dict[str, Any], ref: dict[str, Any], namespace: str) -> bool:
    return all(
        (seen.get(k) or default) == (ref.get(k) or default)
        for k, default in (("name", ""), ("namespace", namespace), ("sectionName", ""))
    )


class Rollouts:
    def __init__(self, measure: Measure, allowlist: tuple[Endpoint, ...]) -> None:
        self.measure = measure
        self.allowlist = allowlist
        self.ready = ReadyPods()
        self.routable = RoutableEndpoints()

    def forget(self, key: Key) -> None:
        self.ready.forget(key)
        self.routable.forget(key)

    async def decide(
        self,
        ld: LLMDeployment,
        images: Images,
        children: ChildCache,
        problems: dict[Slot, tuple[str, ...]] | None = None,
    ) -> Rollout:
        """Raises PlanningError when a slot's spec cannot be rendered (its snapshot is gone).
        `problems`: per slot, its pods that cannot run (PodProblems.by_slot)."""
        revision = revision_of(ld.spec, images)
        old = ld.status.revisions if ld.status is not None else None
        canary = ld.spec.rollout.canary
        url = (
            None
            if canary is None or canary.analysis is None
            else analysis_endpoint(canary.analysis, self.allowlist)
        )
        gateway = ld.spec.rollout.strategy == RolloutStrategy.CANARY and (
            canary is not None and canary.traffic_routing == TrafficRouting.GATEWAY_API
        )
        slots = observe_slots(children, ld, self.ready, self.routable if gateway else None)
        action = (ld.metadata.get("annotations") or {}).get(ACTION_ANNOTATION)
        now = datetime.now(UTC)
        route_ok, route_problem = route_state(children, ld, now)
        args = (ld.spec, revision, old, slots, ld.spec.replicas)
        decision = machine.decide(*args, None, action, now, route_ok, problems)
        if decision.measure and canary is not None and canary.analysis is not None:
            target = decision.revisions.canary
            assert target is not None and url is not None
            measured = await self.measure(url, canary.analysis, ld.namespace, ld.name, target)
            decision = machine.decide(*args, measured, action, now, route_ok, problems)
        snaps = snapshots(children, ld)
        specs = [self._slot(ld, images, revision, snaps, slot, target.revision, target.replicas)
                 for slot, target in decision.slots.items()]  # fmt: skip
        specs.sort(key=lambda s: s.revision != revision)
        return Rollout(decision, revision, specs, self._objects(ld, images, decision, snaps), route_problem)

    def _slot(
        self,
        ld: LLMDeployment,
        images: Images,
        current: str,
        snaps: dict[str, dict[str, Any]],
        slot: Slot,
        revision: str,
        replicas: int,
    ) -> SlotSpec:
        if revision == current:
            return SlotSpec(slot, revision, for_slot(ld, ld.spec, replicas), images)
        snap = snaps.get(revision)
        if snap is None:
            raise PlanningError(
                "RevisionSnapshotMissing",
                f"ControllerRevision {names.controller_revision(ld.name, revision)} with the spec of "
                f"revision {revision} (slot {slot}) is gone; nothing is changed until the spec is "
                "set back to that revision or the rollout is aborted",
            )
        try:
            spec = spec_from_snapshot(snap)
        except ValidationError as e:
            raise PlanningError(
                "RevisionSnapshotUnreadable", f"revision {revision}: {e.errors()[0]['msg']}"
            ) from e
        started = images_from_snapshot(snap, images) or images
        return SlotSpec(slot, revision, for_slot(ld, spec, replicas), started)

    def _objects(
        self, ld: LLMDeployment, images: Images, decision: Decision, snaps: dict[str, dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """Snapshots of the live revisions (kept as they are once they exist), revision Services
        and the HTTPRoute of a canary rollout."""
        r = decision.revisions
        assert r.stable is not None
        objs: list[dict[str, Any]] = []
        number = max((int(s.get("revision") or 0) for s in snaps.values()), default=0)
        live = [r.stable] + ([r.canary] if r.canary else []) + [t.revision for t in decision.slots.values()]
        for revision in dict.fromkeys(live):  # a slot bridging a rollback keeps its snapshot too
            if revision in snaps:
                objs.append(_as_applied(snaps[revision]))
            elif revision == revision_of(ld.spec, images):
                number += 1
                objs.append(controller_revision(ld, revision, number, images))
        if ld.spec.rollout.strategy == RolloutStrategy.CANARY:
            # Until the replaced slot goes, `<name>-canary` keeps selecting the promoted revision:
            # a gateway still on the previous route sends its share there.
            objs += revision_services(ld, r.stable, r.canary or (r.stable if r.scale_down_at else None))
            canary = ld.spec.rollout.canary
            if canary is not None and canary.traffic_routing == TrafficRouting.GATEWAY_API:
                objs.append(http_route(ld, decision.weights, r.stable, r.canary))
        return objs


def _as_applied(snapshot: dict[str, Any]) -> dict[str, Any]:
    """An existing snapshot, re-applied as it is (its data is immutable): kept from pruning."""
    meta = snapshot["metadata"]
    return {
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": {k: meta[k] for k in ("name", "namespace", "labels", "ownerReferences") if k in meta},
        "data": snapshot.get("data"),
        "revision": snapshot.get("revision"),
    }
