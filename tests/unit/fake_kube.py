"""An in-memory API server for handler-tier tests of the reconciler (no cluster).

It keeps objects by (kind, namespace, name), bumps metadata.generation when a spec changes as the
API server does, records every write, and hands the reconciler the watch events a real watch
would deliver (`deliver`). It implements the same protocol as the operator's client (KubeApi).
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

from lightkube import ApiError
from lightkube.models.meta_v1 import Status
from llm_operator import labels as L
from llm_operator.controller.cluster.kube import CREATED_KINDS, MissingApi, ObjKey, obj_key
from llm_operator.controller.reconciler import Reconciler

WITH_GENERATION = {"StatefulSet", "Job", "PodDisruptionBudget", "HorizontalPodAutoscaler", "LeaderWorkerSet",
                   "ScaledObject", "Deployment"}  # fmt: skip


def merged(old: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """`old` with the JSON merge patch (RFC 7386) applied, as the API server applies patch_status's."""
    out = dict(old)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict):
            before = old.get(k)
            out[k] = merged(before if isinstance(before, dict) else {}, v)
        else:
            out[k] = v
    return out


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[ObjKey, dict[str, Any]] = {}
        self.writes: list[tuple[str, str, str]] = []  # (verb, kind, name)
        self.pod_graces: dict[str, int | None] = {}  # deleted pod -> the grace period asked for
        self.reads: list[tuple[str, str]] = []  # (kind, name) read by name
        self.events: list[tuple[str, str, str]] = []  # (type, reason, message)
        self._uids = itertools.count(1)
        self._delivered: dict[ObjKey, str] = {}  # resourceVersion last handed to the reconciler
        self._versions = itertools.count(1)
        self.missing_kinds: set[str] = set()  # kinds whose API (CRD) is not installed
        self.unwatched_kinds: set[str] = set()  # kinds the operator does not watch (CRD came later)
        self.unwatched_names: set[ObjKey] = set()  # objects without our labels (add_foreign)

    # -- KubeApi ---------------------------------------------------------------------------------

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        k = obj_key(obj)
        self.writes.append(("apply", k[0], k[2]))
        if k[0] in self.missing_kinds:
            raise MissingApi(k[0], "404 page not found")  # the API server's plain-text answer
        old = self.objects.get(k)
        if k[0] == "StatefulSet" and old is not None and old["spec"]["selector"] != obj["spec"]["selector"]:
            message = (
                f"StatefulSet.apps {k[2]!r} is invalid: spec: Forbidden: updates to statefulset spec for "
                "fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', ... are forbidden"
            )
            raise ApiError(status=Status(code=422, reason="Invalid", message=message))
        new = copy.deepcopy(obj)
        meta = new["metadata"]
        meta["uid"] = old["metadata"]["uid"] if old else f"uid-{next(self._uids)}"
        if k[0] in WITH_GENERATION:
            generation = old["metadata"]["generation"] if old else 0
            changed = old is None or old.get("spec") != new.get("spec")
            meta["generation"] = generation + 1 if changed else generation
        if old is not None and "status" in old:
            new["status"] = old["status"]
        # Forced server-side apply takes every field it names; status writers keep their entries.
        kept = [m for m in (old or {}).get("metadata", {}).get("managedFields", []) if m.get("subresource")]
        meta["managedFields"] = [*kept, {"manager": L.FIELD_MANAGER, "operation": "Apply"}]
        self._store(k, new)
        return copy.deepcopy(new)

    async def create(self, obj: dict[str, Any]) -> bool:
        k = obj_key(obj)
        assert k[0] in CREATED_KINDS, (
            f"Kube.create cannot create a {k[0]} (controller/cluster/kube.py CREATED_KINDS)"
        )
        self.writes.append(("create", k[0], k[2]))
        if k in self.objects:
            return False
        stored = copy.deepcopy(obj)
        stored["metadata"]["uid"] = f"uid-{next(self._uids)}"
        self._store(k, stored)
        return True

    async def delete(self, kind: str, namespace: str, name: str, *, orphan: bool = False) -> None:
        """Gone at once; the garbage collector is not modelled, so dependents stay either way."""
        self.writes.append(("delete-orphan" if orphan else "delete", kind, name))
        self.objects.pop((kind, namespace, name), None)

    async def add_labels(
        self, kind: str, namespace: str, selector: dict[str, str], owner_uid: str, labels: dict[str, str]
    ) -> int:
        changed = 0
        for (k, ns, name), obj in self.objects.items():
            meta = obj["metadata"]
            owned = any(
                r.get("controller") and r.get("uid") == owner_uid for r in meta.get("ownerReferences", [])
            )
            if k != kind or ns != namespace or not owned or not selector.items() <= meta["labels"].items():
                continue
            if not labels.items() <= meta["labels"].items():
                self.writes.append(("label", kind, name))
                meta["labels"] = {**meta["labels"], **labels}
                self._store((k, ns, name), obj)
                changed += 1
        return changed

    async def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None) -> None:
        self.writes.append(("delete", "Pod", name))
        self.pod_graces[name] = grace_seconds

    async def get_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.objects.get(("LLMDeployment", namespace, name))
        return copy.deepcopy(found) if found else None

    def _deployment(self, namespace: str, name: str) -> dict[str, Any]:
        """The stored deployment, or the API server's 404 for a PATCH of one that is gone."""
        if (body := self.objects.get(("LLMDeployment", namespace, name))) is None:
            message = f'llmdeployments.llmoperator.io "{name}" not found'
            raise ApiError(status=Status(code=404, reason="NotFound", message=message))
        return body

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.writes.append(("status", "LLMDeployment", name))
        body = self._deployment(namespace, name)
        body["status"] = merged(body.get("status", {}), status)

    async def annotate_deployment(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self.writes.append(("annotate", "LLMDeployment", name))
        k = ("LLMDeployment", namespace, name)
        body = self._deployment(namespace, name)
        body["metadata"]["annotations"] = {**body["metadata"].get("annotations", {}), **annotations}
        self._store(k, body)  # a new resourceVersion, as any write

    async def add_configmap_keys(self, namespace: str, name: str, data: dict[str, str]) -> None:
        self.writes.append(("merge", "ConfigMap", name))
        k = ("ConfigMap", namespace, name)
        cm = self.objects.get(k) or {
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "labels": {}},
            "data": {},
        }
        cm["data"] = {**cm.get("data", {}), **data}
        self._store(k, cm)

    async def read(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads.append((kind, name))
        found = self.objects.get((kind, namespace, name))
        return copy.deepcopy(found) if found else None

    async def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get(("PersistentVolumeClaim", namespace, name))

    async def event(self, involved: dict[str, Any], type_: str, reason: str, message: str, now: str) -> None:
        self.events.append((type_, reason, message))

    # -- the test's side of the cluster ----------------------------------------------------------

    def _store(self, k: ObjKey, obj: dict[str, Any]) -> None:
        obj["metadata"]["resourceVersion"] = str(next(self._versions))
        self.objects[k] = obj

    def add_deployment(self, body: dict[str, Any], namespace: str = "default") -> tuple[str, str]:
        body = copy.deepcopy(body)
        meta = body.setdefault("metadata", {})
        meta.update(namespace=namespace, uid=f"uid-{next(self._uids)}", generation=1)
        self._store(("LLMDeployment", namespace, meta["name"]), body)
        return namespace, meta["name"]

    def add_claim(self, name: str, namespace: str = "default", storage: str | None = None) -> None:
        """A claim; with `storage`, of that requested size (and no status yet: unbound)."""
        claim: dict[str, Any] = {
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace},
        }
        if storage is not None:
            claim["spec"] = {"resources": {"requests": {"storage": storage}}}
        self._store(("PersistentVolumeClaim", namespace, name), claim)

    def add_foreign(self, kind: str, namespace: str, name: str, **fields: Any) -> dict[str, Any]:
        """An object someone else made, without the operator's labels (the watch never sees it)."""
        obj = {"kind": kind, "metadata": {"name": name, "namespace": namespace, "labels": {}}, **fields}
        obj["metadata"]["uid"] = f"uid-{next(self._uids)}"
        self._store((kind, namespace, name), obj)
        self.unwatched_names.add((kind, namespace, name))
        return obj

    def add_configmap(self, namespace: str, name: str, data: dict[str, str]) -> None:
        """A ConfigMap written before the operator started (an index another operator wrote)."""
        cm = {
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "labels": {}},
            "data": data,
        }
        self._store(("ConfigMap", namespace, name), cm)

    def edit(self, kind: str, namespace: str, name: str, **fields: Any) -> dict[str, Any]:
        """Someone else changes an object (a controller's status, a user's kubectl edit)."""
        obj = self.objects[(kind, namespace, name)]
        for field, value in fields.items():
            obj[field] = value
            if field == "spec" and kind in WITH_GENERATION | {"LLMDeployment"}:
                obj["metadata"]["generation"] += 1
        # What the API server records of the writer: a controller's status, or someone's edit.
        writer = {"manager": "kube-controller-manager", "operation": "Update", "subresource": "status"}
        if set(fields) != {"status"}:
            writer = {"manager": "kubectl-edit", "operation": "Update"}
        obj["metadata"]["managedFields"] = [*obj["metadata"].get("managedFields", []), writer]
        self._store((kind, namespace, name), obj)
        return obj

    def of_kind(self, kind: str) -> dict[str, dict[str, Any]]:
        return {k[2]: v for k, v in self.objects.items() if k[0] == kind}

    def take_writes(self) -> list[tuple[str, str, str]]:
        writes, self.writes = self.writes, []
        return writes

    async def deliver(self, reconciler: Reconciler) -> None:
        """The watch events a real watch would send since the last delivery (children only)."""
        children = {
            k: v
            for k, v in self.objects.items()
            if k[0] not in ("LLMDeployment", "Secret", "PersistentVolumeClaim", "Pod", *self.unwatched_kinds)
            and k not in self.unwatched_names
        }
        for k, obj in children.items():
            version = obj["metadata"]["resourceVersion"]
            if self._delivered.get(k) != version:
                event = "MODIFIED" if k in self._delivered else "ADDED"
                self._delivered[k] = version
                await reconciler.child_event(event, copy.deepcopy(obj))
        for k in [k for k in self._delivered if k not in children]:
            del self._delivered[k]
            await reconciler.child_event(
                "DELETED", {"kind": k[0], "metadata": {"namespace": k[1], "name": k[2]}}
            )

    async def list_to(self, reconciler: Reconciler) -> None:
        """What a new process's watches list first: every child, as ADDED."""
        self._delivered.clear()
        await self.deliver(reconciler)
