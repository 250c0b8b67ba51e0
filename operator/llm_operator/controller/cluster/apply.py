"""The apply step: server-side apply of what differs, drift repair, pruning, and the watch cache.

Writes are kept to what changed: a child is applied only when its rendered form differs from what
was last applied or when someone else changed it (drift). An idle cluster therefore sees no
writes from the operator.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Collection
from typing import Any

from lightkube import ApiError

from llm_operator import labels as L
from llm_operator.api import v1alpha1 as api
from llm_operator.controller.cluster.kube import KubeApi, MissingApi, ObjKey, obj_key
from llm_operator.controller.metrics import REPLACED
from llm_operator.controller.observe.observe import Applied, ChildCache, Key, drifted, owner_key
from llm_operator.plan.types import PlanningError
from llm_operator.render.model_fetch import MODEL_INDEX

log = logging.getLogger(__name__)

# Children that name others and report on them: applied once the others are.
REFERRING_KINDS = frozenset({"HorizontalPodAutoscaler", "ScaledObject", "HTTPRoute"})
# Applies in flight at once, across all reconcile workers: neither many reconciles nor a large
# multi-node deployment (a StatefulSet per group) can take the client's whole connection pool
# (100, some held by watches).
APPLIES_IN_FLIGHT = 32


def digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


class Applier:
    def __init__(self, kube: KubeApi) -> None:
        self.kube = kube
        self.children = ChildCache()  # watch cache of our children
        self.applied: dict[ObjKey, Applied] = {}
        self._applying: set[ObjKey] = set()
        self._in_flight = asyncio.Semaphore(APPLIES_IN_FLIGHT)
        # The API server's words when it last refused an optional kind for want of its CRD.
        self.missing_words: dict[str, str] = {}

    def observe(self, event: str, obj: dict[str, Any]) -> Key | None:
        """A child's watch event: update the cache, notice drift; returns the owning deployment
        when a reconcile has something new to read. Not for the echo of our own apply, nor for a
        change the reconcile does not read (a PodDisruptionBudget's status at every pod event):
        each pass renders the deployment again, and at thousands of deployments those passes were
        most of the operator's CPU."""
        k = obj_key(obj)
        if event == "DELETED":
            self.children.pop(k, None)
            self.applied.pop(k, None)
            return owner_key(obj)
        before = self.children.get(k)
        obj = self.children[k] = cached(obj)
        applied = self.applied.get(k)
        # Our own apply's event can come before its response: not someone else's change. A status
        # that changed meanwhile is a controller's answer to it (a gateway accepting the route at
        # its new generation), after the applying pass decided: the next pass must read it.
        if k in self._applying:
            answered = before is not None and _status_read(before) != _status_read(obj)
            return owner_key(obj) if answered else None
        if applied is not None and drifted(obj, applied):
            log.info("%s %s/%s changed outside the operator: restoring it", *k)
            self.applied.pop(k, None)
        elif before is not None and _as_read(before) == _as_read(obj):
            return None
        return owner_key(obj)

    def forget(self, key: Key) -> None:
        for k, _ in self.children.owned_by(key):
            self.applied.pop(k, None)

    async def check_names(self, objs: list[dict[str, Any]]) -> None:
        """Before a child is first applied, make sure its name is free or already the deployment's.
        Server-side apply with force would otherwise take over a same-named object someone else
        made: rewrite it, add our controller reference (the garbage collector then deletes it with
        the deployment) and prune it later. Raises PlanningError NameConflict naming each object
        held by someone else; nothing is applied then. One read per new child, once: what the
        operator applied or the watch shows as the deployment's needs none."""
        owner: dict[str, Any] | None = None
        new: list[dict[str, Any]] = []
        for obj in objs:
            ref = _controller_ref(obj)
            if ref is not None and not self._known_as(obj, ref["uid"]):
                owner = ref
                new.append(obj)
        if owner is None:
            return

        async def holder(obj: dict[str, Any]) -> dict[str, Any] | None:
            async with self._in_flight:
                return await self.kube.read(*obj_key(obj))

        found = await asyncio.gather(*(holder(o) for o in new))
        taken = {
            obj_key(obj): existing
            for obj, existing in zip(new, found, strict=True)
            if existing is not None and _controller_uid(existing) != owner["uid"]
        }
        if not taken:
            return
        if all(_held_by_predecessor(existing, owner) for existing in taken.values()):
            # A deployment of this name was deleted and made again: its children go with the
            # garbage collector's next pass. Retried with backoff, not a conflict to report.
            raise PredecessorChildren(f"{len(taken)} children of a deleted {api.KIND} {owner['name']} remain")
        raise PlanningError("NameConflict", name_conflict_message(owner["name"], taken))

    def _known_as(self, obj: dict[str, Any], uid: str) -> bool:
        k = obj_key(obj)
        seen = self.children.get(k)
        return k in self.applied or (seen is not None and _controller_uid(seen) == uid)

    async def apply(self, obj: dict[str, Any]) -> None:
        k = obj_key(obj)
        d = digest(obj)
        applied = self.applied.get(k)
        if applied is not None and applied.digest == d and k in self.children:
            return
        seen = self.children.get(k)
        if seen is not None and seen["metadata"].get("deletionTimestamp"):
            return  # being deleted (replaced): created again once its DELETED event came
        if applied is None and seen is not None and _left_as_applied(seen, d):
            # An earlier operator process applied exactly this and nobody changed it since: a
            # restart or a new leader costs no write.
            generation = seen["metadata"].get("generation")
            self.applied[k] = Applied(d, generation, cached(obj) if generation is None else None)
            return
        meta = obj["metadata"]
        obj = {**obj, "metadata": {**meta, "annotations": {**meta.get("annotations", {}), L.APPLIED: d}}}
        self._applying.add(k)
        try:
            result = await self.kube.apply(obj)
        except ApiError as e:
            if e.status.code != 422 or seen is None or not _immutable_changed(obj, seen):
                raise
            await self._replace(obj, seen)
            return
        finally:
            self._applying.discard(k)
        generation = result.get("metadata", {}).get("generation")
        self.applied[k] = Applied(d, generation, cached(obj) if generation is None else None)
        # The watch may have brought a newer state while the apply was in flight (a controller's
        # status: pods Ready at once): keep it, or the cache would hold the older response until
        # an event that may never come. The apply's own event follows in any case.
        if _version(self.children.get(k)) == _version(seen):
            self.children[k] = cached(result)

    async def apply_all(self, objs: list[dict[str, Any]], optional: Collection[str]) -> set[str]:
        """Apply what changed, together rather than one after the other: a spec edit reaches its
        StatefulSet one API round trip after the edit, not one per changed child before it. Only
        what reports on the children it names (an autoscaler its workload's scale, a route its
        backends) waits for the rest, or it would say its target is missing meanwhile. Returns
        the kinds in `optional` whose API is missing; other errors are raised once every request
        has finished (the cache then knows what each one did)."""

        async def apply(obj: dict[str, Any]) -> None:
            async with self._in_flight:
                await self.apply(obj)

        missing: set[str] = set()
        for wave in (
            [o for o in objs if o["kind"] not in REFERRING_KINDS],
            [o for o in objs if o["kind"] in REFERRING_KINDS],
        ):
            results = await asyncio.gather(*(apply(obj) for obj in wave), return_exceptions=True)
            for obj, result in zip(wave, results, strict=True):
                if isinstance(result, MissingApi) and obj["kind"] in optional:
                    missing.add(obj["kind"])
                    self.missing_words[obj["kind"]] = result.words
                elif isinstance(result, BaseException):
                    raise result
        return missing

    async def _replace(self, obj: dict[str, Any], seen: dict[str, Any]) -> None:
        """A StatefulSet whose selector (or another field fixed at creation) must change, as one
        made by an operator before slots (no slot label in its selector): its pods and history are
        given the new selector's labels, it is deleted leaving them running (orphan), and the next
        apply creates it again, which adopts them and rolls them one at a time. Nothing stops
        serving; deleting the pods with it would stop every replica at once."""
        kind, namespace, name = obj_key(obj)
        old = seen["spec"]["selector"].get("matchLabels", {})
        new = obj["spec"]["selector"].get("matchLabels", {})
        uid = seen["metadata"].get("uid", "")
        added = {key: value for key, value in new.items() if old.get(key) != value}
        for owned in ("Pod", "ControllerRevision"):
            await self.kube.add_labels(owned, namespace, old, uid, added)
        log.warning(
            "%s %s/%s: a field it was created with changes (selector %s -> %s): replacing it, its pods "
            "keep running and are adopted by the new one",
            kind, namespace, name, old, new,
        )  # fmt: skip
        await self.kube.delete(kind, namespace, name, orphan=True)
        self.applied.pop((kind, namespace, name), None)
        REPLACED.labels(kind).inc()

    async def prune(self, owner: Key, keep: set[ObjKey], held: frozenset[tuple[str, str]]) -> None:
        """Delete serving children the spec no longer renders (removed pools, fewer groups, the
        autoscaler of the other provider, a slot that is not rendered). Jobs stay (their outcome is
        the engine's record); pools waiting for an engine keep serving (`held`: (slot, pool); an
        object of an operator before slots is slot a); objects that carry our labels but that the
        deployment does not control (KEDA copies a ScaledObject's labels onto its HPA) are not
        ours."""
        for k, obj in self.children.owned_by(owner):
            kind = k[0]
            if kind == "Job" or k in keep or not _controlled_by(obj, owner):
                continue
            labels = obj["metadata"].get("labels", {})
            if L.POOL in labels and (labels.get(L.SLOT, "a"), labels[L.POOL]) in held:
                continue
            await self.kube.delete(kind, k[1], k[2])
            self.applied.pop(k, None)
            # Kinds watched only once installed (a ScaledObject applied after KEDA came) get no
            # DELETED event: the cache must not keep what we deleted, or it would pass for applied.
            self.children.pop(k, None)


# Kinds whose status no reconcile reads: the controllers that write it (the disruption
# controller at every pod event) change nothing the operator decides on.
STATUS_UNREAD = frozenset({"PodDisruptionBudget", "Service", "InferencePool"})
UNREAD_METADATA = ("resourceVersion", "managedFields")  # change at every write, whoever wrote


def _as_read(obj: dict[str, Any]) -> dict[str, Any]:
    """A cached child as far as a reconcile reads it."""
    meta = {k: v for k, v in obj["metadata"].items() if k not in UNREAD_METADATA}
    kept = {k: v for k, v in obj.items() if k != "status"}
    return {**kept, "metadata": meta, "status": _status_read(obj)}


def _status_read(obj: dict[str, Any]) -> Any:
    return None if obj.get("kind") in STATUS_UNREAD else obj.get("status")


def _version(obj: dict[str, Any] | None) -> str | None:
    return None if obj is None else obj["metadata"].get("resourceVersion")


def cached(obj: dict[str, Any]) -> dict[str, Any]:
    """What the cache keeps of a child: what the reconcile reads. A ConfigMap's values become their
    digests (drift is still seen; a model repository is ~17 KB), a workload's pod templates their
    labels (the revision they run; the template is ~4/5 of a StatefulSet). With thousands of
    deployments this is most of the operator's memory."""
    kind = obj.get("kind")
    if kind == "ConfigMap" and obj["metadata"].get("name") == MODEL_INDEX:
        return obj  # its values are read: where each model is (a few hundred bytes per model)
    if kind == "ConfigMap" and obj.get("data"):
        return {**obj, "data": {k: _short(v) for k, v in obj["data"].items()}}
    if kind == "StatefulSet" and "template" in obj.get("spec", {}):
        return {**obj, "spec": {**obj["spec"], "template": _labels_only(obj["spec"]["template"])}}
    if kind == "LeaderWorkerSet" and "leaderWorkerTemplate" in obj.get("spec", {}):
        lwt = obj["spec"]["leaderWorkerTemplate"]
        slim = {k: _labels_only(v) if k.endswith("Template") else v for k, v in lwt.items()}
        return {**obj, "spec": {**obj["spec"], "leaderWorkerTemplate": slim}}
    return obj


def _short(value: str) -> str:
    return value if len(value) <= 64 else "sha256:" + hashlib.sha256(value.encode()).hexdigest()


def _labels_only(template: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"labels": (template.get("metadata") or {}).get("labels") or {}}}


def _left_as_applied(seen: dict[str, Any], d: str) -> bool:
    """The object carries the digest of this very rendering, and every field manager but ours
    wrote only its status (controllers do; `kubectl edit`, `rollout restart` or another
    controller writing the spec or metadata make the operator apply again)."""
    meta = seen["metadata"]
    return meta.get("annotations", {}).get(L.APPLIED) == d and all(
        m.get("manager") == L.FIELD_MANAGER or m.get("subresource") == "status"
        for m in meta.get("managedFields") or []
    )


# Fields of a StatefulSet's spec that the API server refuses to change (422).
_FIXED_AT_CREATION = ("selector", "serviceName", "podManagementPolicy", "volumeClaimTemplates")


def _immutable_changed(obj: dict[str, Any], seen: dict[str, Any]) -> bool:
    if obj["kind"] != "StatefulSet":
        return False
    want, have = obj.get("spec", {}), seen.get("spec", {})
    return any(f in want and want[f] != have.get(f) for f in _FIXED_AT_CREATION)


class PredecessorChildren(Exception):
    """Children of a deleted deployment of the same name still hold their names (briefly)."""


def name_conflict_message(deployment: str, held: dict[ObjKey, dict[str, Any]]) -> str:
    def who(key: ObjKey, obj: dict[str, Any]) -> str:
        ref = _controller_ref(obj)
        holder = f"controlled by {ref.get('kind')} {ref.get('name')}" if ref else "made by someone else"
        return f"{key[0]} {key[2]} ({holder})"

    shown = [who(k, o) for k, o in list(held.items())[:5]]
    names = ", ".join(shown) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
    return (
        f"{names} {'already exist' if len(held) > 1 else 'already exists'} in this namespace; the "
        "operator does not take over objects it did not create. Delete or rename "
        f"{'them' if len(held) > 1 else 'it'}, or give this LLMDeployment a name other than {deployment}"
    )


def _controller_ref(obj: dict[str, Any]) -> dict[str, Any] | None:
    return next((r for r in obj["metadata"].get("ownerReferences") or [] if r.get("controller")), None)


def _controller_uid(obj: dict[str, Any]) -> str | None:
    ref = _controller_ref(obj)
    return ref.get("uid") if ref is not None and ref.get("kind") == api.KIND else None


def _held_by_predecessor(existing: dict[str, Any], owner: dict[str, Any]) -> bool:
    ref = _controller_ref(existing)
    return ref is not None and ref.get("kind") == api.KIND and ref.get("name") == owner["name"]


def _controlled_by(obj: dict[str, Any], owner: Key) -> bool:
    return any(
        ref.get("controller") and ref.get("kind") == api.KIND and ref.get("name") == owner[1]
        for ref in obj["metadata"].get("ownerReferences") or []
    )
