"""Kubernetes I/O: server-side apply under one field manager, and label-filtered watch caches.

kopf sends no server-side label selectors, so children are watched here instead, with
`app.kubernetes.io/managed-by=llm-operator` as a server-side selector: the operator never streams
every StatefulSet/ConfigMap/Service of the cluster, only its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import httpx2 as httpx
from lightkube import ALL_NS, ApiError, AsyncClient, codecs
from lightkube.core.resource import NamespacedResource
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.apps_v1 import ControllerRevision, Deployment, StatefulSet
from lightkube.resources.autoscaling_v2 import HorizontalPodAutoscaler
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import (
    ConfigMap,
    Node,
    PersistentVolumeClaim,
    Pod,
    Secret,
    Service,
    ServiceAccount,
)
from lightkube.resources.networking_v1 import NetworkPolicy
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.resources.rbac_authorization_v1 import Role, RoleBinding
from lightkube.types import CascadeType, PatchType

from llm_operator import labels as L
from llm_operator.api import v1alpha1 as api
from llm_operator.controller.metrics import API_WRITES

log = logging.getLogger(__name__)

LLMDeploymentResource = create_namespaced_resource(api.GROUP, api.VERSION, api.KIND, api.PLURAL)
LeaderWorkerSet = create_namespaced_resource(
    "leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet", "leaderworkersets"
)
LWS_CRD = "leaderworkersets.leaderworkerset.x-k8s.io"
ScaledObject = create_namespaced_resource("keda.sh", "v1alpha1", "ScaledObject", "scaledobjects")
SCALED_OBJECT_CRD = "scaledobjects.keda.sh"
HTTPRoute = create_namespaced_resource("gateway.networking.k8s.io", "v1", "HTTPRoute", "httproutes")
HTTP_ROUTE_CRD = "httproutes.gateway.networking.k8s.io"
InferencePool = create_namespaced_resource(
    "inference.networking.k8s.io", "v1", "InferencePool", "inferencepools"
)
INFERENCE_POOL_CRD = "inferencepools.inference.networking.k8s.io"

CHILD_KINDS: dict[str, Any] = {
    "ConfigMap": ConfigMap,
    "Service": Service,
    "StatefulSet": StatefulSet,
    "PodDisruptionBudget": PodDisruptionBudget,
    "HorizontalPodAutoscaler": HorizontalPodAutoscaler,
    "Job": Job,
    "LeaderWorkerSet": LeaderWorkerSet,  # watched only when its CRD is installed
    "ScaledObject": ScaledObject,  # KEDA's; watched only when its CRD is installed
    "ControllerRevision": ControllerRevision,  # revision snapshots (canary rollouts)
    "HTTPRoute": HTTPRoute,  # Gateway API's; watched only when its CRD is installed
    "NetworkPolicy": NetworkPolicy,
    # routing.mode inference-pool: the router (render/router/objects.py) and its pool.
    "Deployment": Deployment,
    "ServiceAccount": ServiceAccount,
    "Role": Role,
    "RoleBinding": RoleBinding,
    "InferencePool": InferencePool,  # the Gateway API Inference Extension's; watched once installed
}
# Kinds whose existing objects the operator relabels (adoption by a replaced StatefulSet).
RELABELED_KINDS: dict[str, Any] = {"Pod": Pod, "ControllerRevision": ControllerRevision}
# Kinds created once and never overwritten: a multi-node group's launch identity, an engine-build Job
# (named by its engine's cache key; a Job's pod template is immutable).
CREATED_KINDS: dict[str, Any] = {"Secret": Secret, "Job": Job}
# The chart's RBAC grants exactly what these tables and the methods below call (and kopf's needs,
# controller/cluster/rbac.py): tests/unit/test_rbac.py drives every method and compares.

ObjKey = tuple[str, str, str]  # kind, namespace, name
LIST_PAGE = 250


class NotLeading(Exception):
    """A write was refused: with leader election on, this replica does not hold the Lease."""


class MissingApi(Exception):
    """The API server does not serve this kind: its CRD is not installed. (It answers 404 with a
    plain-text body then, not a Status, so lightkube raises no ApiError.) `words`: that body."""

    def __init__(self, kind: str, words: str = "") -> None:
        super().__init__(kind, words)
        self.kind, self.words = kind, words


def obj_key(obj: dict[str, Any]) -> ObjKey:
    meta = obj["metadata"]
    return obj["kind"], meta.get("namespace", ""), meta["name"]


def merge_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) from old to new: merging keeps nested keys a patch does not
    name, so every key that went away (a finished canary's fields) is named with null."""
    patch: dict[str, Any] = {k: None for k in old if k not in new}
    for k, v in new.items():
        before = old.get(k)
        patch[k] = merge_patch(before, v) if isinstance(v, dict) and isinstance(before, dict) else v
    return patch


def namespace_terminating(e: ApiError) -> bool:
    """The API server refused a write because the namespace is being deleted (403, cause
    NamespaceTerminating)."""
    details = e.status.details
    return e.status.code == 403 and any(
        c.reason == "NamespaceTerminating" for c in (details.causes if details and details.causes else [])
    )


class KubeApi(Protocol):
    """The requests the reconcile makes (watches are wired separately, in handlers.py)."""

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]: ...
    async def create(self, obj: dict[str, Any]) -> bool: ...
    async def read(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None: ...
    async def delete(self, kind: str, namespace: str, name: str, *, orphan: bool = False) -> None: ...
    async def add_labels(
        self, kind: str, namespace: str, selector: dict[str, str], owner_uid: str, labels: dict[str, str]
    ) -> int: ...
    async def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None) -> None: ...
    async def get_deployment(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None: ...
    async def annotate_deployment(self, namespace: str, name: str, annotations: dict[str, str]) -> None: ...
    async def add_configmap_keys(self, namespace: str, name: str, data: dict[str, str]) -> None: ...
    async def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    async def event(
        self, involved: dict[str, Any], type_: str, reason: str, message: str, now: str
    ) -> None: ...


class Kube:
    """The operator's one API client (lazy connection, kubeconfig or in-cluster config). Every
    write asks `fence` first: with leader election, only while this replica holds the Lease."""

    def __init__(self, client: AsyncClient | None = None, fence: Callable[[], None] | None = None) -> None:
        self.client = client or AsyncClient(field_manager=L.FIELD_MANAGER)
        # Asked before every write; raises NotLeading when leader election says we must not write.
        self._fence = fence or (lambda: None)

    def _write(self, kind: str, verb: str) -> None:
        try:
            self._fence()
        except NotLeading:
            log.warning("not sending %s %s: this replica no longer holds the leader Lease", verb, kind)
            raise
        API_WRITES.labels(kind, verb).inc()

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        kind, namespace, name = obj_key(obj)
        self._write(kind, "apply")
        try:
            result = await self.client.patch(
                CHILD_KINDS[kind],
                name,
                obj,
                namespace=namespace,
                patch_type=PatchType.APPLY,
                field_manager=L.FIELD_MANAGER,
                force=True,
            )
        except httpx.HTTPStatusError as e:
            if e.response.status_code == 404 and not isinstance(e, ApiError):
                raise MissingApi(kind, e.response.text.strip()[:200] or "404") from e
            raise
        return _as_dict(result)

    async def create(self, obj: dict[str, Any]) -> bool:
        """Create an object that must never be overwritten (a Secret holding a generated key);
        one that exists already is left as it is. False: it existed."""
        self._write(obj["kind"], "create")
        try:
            await self.client.create(CREATED_KINDS[obj["kind"]].from_dict(obj))
        except ApiError as e:
            if e.status.code != 409:
                raise
            return False
        return True

    async def read(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A child's kind and name as the API server has it, whoever made it (the watch sees only
        objects with our labels); None when there is none, or when its API is not installed."""
        try:
            return _as_dict(await self.client.get(CHILD_KINDS[kind], name, namespace=namespace))
        except ApiError as e:
            if e.status.code == 404:
                return None
            raise
        except httpx.HTTPStatusError as e:  # a plain-text 404: no CRD, so no such object
            if e.response.status_code == 404:
                return None
            raise

    async def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The claim (its size: spec.resources, status.capacity); None when it does not exist."""
        try:
            claim = await self.client.get(PersistentVolumeClaim, name, namespace=namespace)
        except ApiError as e:
            if e.status.code == 404:
                return None
            raise
        return _as_dict(claim)

    async def delete(self, kind: str, namespace: str, name: str, *, orphan: bool = False) -> None:
        """Delete a child; its dependents go too (in the background), or stay with `orphan`."""
        self._write(kind, "delete")
        cascade = CascadeType.ORPHAN if orphan else CascadeType.BACKGROUND
        try:
            await self.client.delete(CHILD_KINDS[kind], name, namespace=namespace, cascade=cascade)
        except httpx.HTTPStatusError as e:  # gone, or its whole API is (KEDA uninstalled)
            if e.response.status_code != 404:
                raise

    async def add_labels(
        self, kind: str, namespace: str, selector: dict[str, str], owner_uid: str, labels: dict[str, str]
    ) -> int:
        """Merge `labels` into the objects of `kind` that match `selector` and are controlled by
        the object `owner_uid`; how many were changed."""
        res = RELABELED_KINDS[kind]
        changed = 0
        matching: dict[str, Any] = dict(selector)
        async for obj in self.client.list(res, namespace=namespace, labels=matching):
            meta = obj.metadata
            owned = any(r.controller and r.uid == owner_uid for r in meta.ownerReferences or [])
            if not owned or (meta.labels or {}).items() >= labels.items():
                continue
            self._write(kind, "label")
            try:
                await self.client.patch(
                    res,
                    meta.name,
                    {"metadata": {"labels": labels}},
                    namespace=namespace,
                    patch_type=PatchType.MERGE,
                )
            except ApiError as e:
                if e.status.code != 404:
                    raise
                continue
            changed += 1
        return changed

    async def has_leader_worker_set(self) -> bool:
        """Is the LeaderWorkerSet API installed? (Checked at start: restart after installing it.)"""
        return await self.has_crd(LWS_CRD)

    async def has_crd(self, name: str) -> bool:
        try:
            await self.client.get(CustomResourceDefinition, name)
        except ApiError as e:
            if e.status.code in (403, 404):
                return False
            raise
        return True

    async def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None) -> None:
        self._write("Pod", "delete")
        try:
            await self.client.delete(Pod, name, namespace=namespace, grace_period=grace_seconds)
        except ApiError as e:
            if e.status.code != 404:
                raise

    async def get_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return _as_dict(await self.client.get(LLMDeploymentResource, name, namespace=namespace))
        except ApiError as e:
            if e.status.code == 404:
                return None
            raise

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self._write(api.KIND, "status")
        patch = {"status": status}
        await self.client.patch(LLMDeploymentResource.Status, name, patch, namespace=namespace,
                                patch_type=PatchType.MERGE)  # fmt: skip

    async def annotate_deployment(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        """A merge patch of metadata only (never the spec), owned by the operator's field manager."""
        self._write(api.KIND, "annotate")
        patch = {"metadata": {"annotations": annotations}}
        await self.client.patch(LLMDeploymentResource, name, patch, namespace=namespace,
                                patch_type=PatchType.MERGE)  # fmt: skip

    async def add_configmap_keys(self, namespace: str, name: str, data: dict[str, str]) -> None:
        """Add keys to a ConfigMap shared by deployments (the engine index), creating it if absent."""
        self._write("ConfigMap", "merge")
        try:
            await self.client.patch(
                ConfigMap, name, {"data": data}, namespace=namespace, patch_type=PatchType.MERGE
            )
        except ApiError as e:
            if e.status.code != 404:
                raise
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": namespace, "labels": {L.MANAGED_BY: "llm-operator"}},
                "data": data,
            }
            await self.client.create(codecs.from_dict(body))

    async def event(self, involved: dict[str, Any], type_: str, reason: str, message: str, now: str) -> None:
        meta = involved["metadata"]
        self._write("Event", "create")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": api.API_VERSION,
                "kind": api.KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "source": {"component": "llm-operator"},
            "reportingComponent": "llm-operator",
        }
        try:
            await self.client.create(codecs.from_dict(body))
        except ApiError as e:  # an Event is best effort; status carries the lasting state
            log.warning("posting event %s for %s/%s failed: %s", reason, meta["namespace"], meta["name"], e)

    async def watch(
        self,
        res: Any,
        on_event: Callable[[str, dict[str, Any]], Awaitable[None]],
        *,
        namespace: str | None,
        labels: dict[str, Any] | None = None,
        fields: dict[str, Any] | None = None,
        listed: asyncio.Event | None = None,
    ) -> None:
        """List (each object as ADDED; then `listed` is set), then stream events from the list's
        resourceVersion, forever; lightkube resumes on errors, a failed stream lists again."""
        scope: dict[str, Any] = {"labels": labels, "fields": fields}
        if issubclass(res, NamespacedResource):  # cluster-scoped kinds take no namespace at all
            scope["namespace"] = namespace or ALL_NS
        while True:
            try:
                # In pages: a restart over thousands of deployments never holds one whole list.
                items = self.client.list(res, chunk_size=LIST_PAGE, **scope)
                async for obj in items:
                    await on_event("ADDED", _as_dict(obj))
                if listed is not None:
                    listed.set()
                stream = self.client.watch(
                    res, resource_version=items.resourceVersion, on_error=_resume, **scope
                )
                async for kind, obj in stream:
                    await on_event(kind, _as_dict(obj))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("watch of %s failed; restarting in 2 s", getattr(res, "__name__", res))
                await asyncio.sleep(2)


def _resume(exc: Exception, count: int) -> Any:
    from lightkube.types import OnErrorAction, OnErrorResult

    log.warning("watch error (%s), retry %d", exc, count)
    return OnErrorResult(OnErrorAction.RETRY, sleep=min(30, 2**count))


def _as_dict(obj: Any) -> dict[str, Any]:
    """The object as a dict, metadata.managedFields cut to who wrote (manager, subresource): the
    fields each owns are about half of a cached StatefulSet, and nothing here reads them."""
    result = obj if isinstance(obj, dict) else obj.to_dict()
    assert isinstance(result, dict)
    meta = result.get("metadata", {})
    if "managedFields" in meta:
        meta["managedFields"] = [
            {k: m[k] for k in ("manager", "subresource") if k in m} for m in meta["managedFields"]
        ]
    return result


__all__ = ["CHILD_KINDS", "Kube", "LLMDeploymentResource", "Node", "NotLeading", "Pod", "obj_key"]
