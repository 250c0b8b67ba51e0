"""The chart's RBAC is exactly what the operator calls: every request of the one API client
(controller/cluster/kube.py: every method driven over every kind its tables allow, and the watches the
startup handler opens), of leader election (controller/cluster/lease.py), plus kopf's own needs
(controller/cluster/rbac.py), recorded as (group, resource, verb) and compared with the rendered rules in
both watch modes. A rule the code does not use fails, and so does a call without a rule."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from types import SimpleNamespace
from typing import Any, cast

import kopf
import pytest
from lightkube import ApiError, AsyncClient
from lightkube.core.resource import NamespacedResource
from lightkube.models.meta_v1 import Status
from lightkube.types import PatchType
from llm_operator.controller import handlers
from llm_operator.controller.cluster.kube import CHILD_KINDS, CREATED_KINDS, RELABELED_KINDS, Kube
from llm_operator.controller.cluster.lease import ElectionConfig, LeaseElector
from llm_operator.controller.cluster.rbac import Permission, granted_permissions, kopf_permissions
from llm_operator.controller.config import OperatorConfig
from llm_operator.images import Images

from tests.unit.test_chart import needs_helm, render
from tests.unit.test_lease import FakeClock, LeaseStore

NOT_FOUND = ApiError(status=Status(code=404, message="not found"))


class Recorder:
    """An AsyncClient that records the permission each request needs and answers as an empty
    cluster would; `missing` makes the next PATCH answer 404 (a create follows in the code)."""

    def __init__(self, inner: Any = None) -> None:
        self.seen: set[Permission] = set()
        self.inner = inner
        self.listed: list[Any] = []  # objects every list returns
        self.missing = False

    def _see(self, res: Any, *verbs: str) -> None:
        info = res._api_info
        resource = info.plural + (f"/{info.action}" if info.action else "")
        cluster = not issubclass(res, NamespacedResource)
        self.seen |= {Permission(info.resource.group, resource, v, cluster) for v in verbs}

    async def get(self, res: Any, name: str, **kw: Any) -> Any:
        self._see(res, "get")
        return await self.inner.get(res, name, **kw) if self.inner else {"metadata": {}}

    async def create(self, obj: Any, **_: Any) -> None:
        self._see(type(obj), "create")
        if self.inner:
            await self.inner.create(obj)

    async def replace(self, obj: Any, **_: Any) -> None:
        self._see(type(obj), "update")
        if self.inner:
            await self.inner.replace(obj)

    async def patch(self, res: Any, name: str, obj: Any, *, patch_type: PatchType, **_: Any) -> Any:
        # Server-side apply creates what does not exist: the API server authorizes that as create.
        self._see(res, "patch", *(["create"] if patch_type == PatchType.APPLY else []))
        if self.missing:
            self.missing = False
            raise NOT_FOUND
        return {}

    async def delete(self, res: Any, name: str, **_: Any) -> None:
        self._see(res, "delete")

    def list(self, res: Any, **_: Any) -> Any:
        self._see(res, "list")
        recorder = self

        class Listing:
            resourceVersion = "1"

            async def __aiter__(self) -> AsyncIterator[Any]:
                for obj in recorder.listed:
                    yield obj

        return Listing()

    async def watch(self, res: Any, **_: Any) -> AsyncIterator[Any]:
        self._see(res, "watch")
        await asyncio.Event().wait()  # a stream with nothing to say
        yield  # pragma: no cover


def meta(kind: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": "x", "namespace": "n", "uid": "u"}}


def owned_without_labels() -> Any:
    owner = SimpleNamespace(controller=True, uid="u")
    return SimpleNamespace(metadata=SimpleNamespace(name="x", ownerReferences=[owner], labels={}))


async def drive_every_kube_method(recorder: Recorder) -> None:
    """Each request method of Kube over every kind it may be given (its tables)."""
    kube = Kube(client=cast(AsyncClient, recorder))
    calls: dict[str, list[Callable[[], Awaitable[Any]]]] = {
        "apply": [partial(kube.apply, meta(kind)) for kind in CHILD_KINDS],
        "create": [partial(kube.create, meta(kind)) for kind in CREATED_KINDS],
        "delete": [partial(kube.delete, kind, "n", "x") for kind in CHILD_KINDS],
        "add_labels": [partial(kube.add_labels, kind, "n", {}, "u", {"a": "b"}) for kind in RELABELED_KINDS],
        "read": [partial(kube.read, kind, "n", "x") for kind in CHILD_KINDS],
        "read_claim": [lambda: kube.read_claim("n", "x")],
        "has_leader_worker_set": [kube.has_leader_worker_set],
        "has_crd": [lambda: kube.has_crd("x")],
        "delete_pod": [lambda: kube.delete_pod("n", "x")],
        "get_deployment": [lambda: kube.get_deployment("n", "x")],
        "patch_status": [lambda: kube.patch_status("n", "x", {})],
        "annotate_deployment": [lambda: kube.annotate_deployment("n", "x", {"k": "v"})],
        "add_configmap_keys": [lambda: kube.add_configmap_keys("n", "x", {"k": "v"})],
        "event": [lambda: kube.event(meta("LLMDeployment"), "Normal", "R", "m", "2026-01-01T00:00:00Z")],
    }  # fmt: skip
    methods = {n for n, f in inspect.getmembers(Kube, inspect.iscoroutinefunction) if not n.startswith("_")}
    # watch: its resources are what startup opens (drive_startup_watches).
    assert methods - {"watch"} == set(calls), "a new Kube method: drive it here over its kinds"
    recorder.listed = [owned_without_labels()]
    for call in (c for cs in calls.values() for c in cs):
        await call()
    recorder.missing = True  # the engine index ConfigMap does not exist yet: created
    await kube.add_configmap_keys("n", "x", {"k": "v"})


async def drive_startup_watches(
    recorder: Recorder, namespaces: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """kopf's startup handler, every optional API installed: the watches it opens."""
    recorder.listed = []
    monkeypatch.setattr(handlers, "Kube", lambda fence: Kube(client=cast(AsyncClient, recorder), fence=fence))
    images = Images(runtime="r", cpu_runtime="c", engine_builder="b", trtllm_version="0.20.0")
    config = OperatorConfig(images, 1, 0, 0, namespaces, None)
    monkeypatch.setattr(handlers.Runtime, "config", config)
    monkeypatch.setattr(handlers.Runtime, "reconciler", None)  # startup sets these: restored after
    monkeypatch.setattr(handlers.Runtime, "tasks", [])
    startup: Any = handlers.startup  # kopf's decorator types it as an activity
    cleanup: Any = handlers.cleanup
    await startup(settings=kopf.OperatorSettings())
    try:
        await asyncio.sleep(0.05)  # every watch task lists, then waits on its stream
    finally:
        await cleanup()


async def drive_leader_election(recorder: Recorder) -> None:
    recorder.inner, clock = LeaseStore(), FakeClock()
    config = ElectionConfig("rel-llm-operator", "ops", "a", 15, 10, 2)
    elector = LeaseElector(config, cast(AsyncClient, recorder), clock.clock())
    assert await elector._attempt(), "created"
    clock.now += 2
    assert await elector._attempt(), "renewed"
    await elector.release()


async def operator_permissions(
    namespaces: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> set[Permission]:
    recorder = Recorder()
    await drive_every_kube_method(recorder)
    await drive_startup_watches(recorder, namespaces, monkeypatch)
    await drive_leader_election(recorder)
    return recorder.seen | kopf_permissions(all_namespaces=not namespaces) | granted_permissions()


def rules_of(docs: list[dict[str, Any]], kind: str, name: str) -> set[tuple[str, str, str]]:
    (role,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


@needs_helm
@pytest.mark.parametrize(("values", "namespaces"), [("defaults", ()), ("namespaces", ("team-a", "team-b"))])
async def test_the_chart_grants_exactly_what_the_operator_calls(
    values: str, namespaces: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    needed = await operator_permissions(namespaces, monkeypatch)
    leases = {p for p in needed if p.resource == "leases"}
    cluster = {p for p in needed if p.cluster_scoped}
    children = needed - leases - cluster
    docs = render(values)

    def compare(granted: set[tuple[str, str, str]], wanted: set[Permission], role: str) -> None:
        wanted_ = {(p.group, p.resource, p.verb) for p in wanted}
        assert not granted - wanted_, (
            f"{role} grants what the operator never calls: {sorted(granted - wanted_)}"
        )
        assert not wanted_ - granted, f"{role} lacks what the operator calls: {sorted(wanted_ - granted)}"

    compare(rules_of(docs, "ClusterRole", "rel-llm-operator-cluster"), cluster, "<fullname>-cluster")
    compare(rules_of(docs, "ClusterRole", "rel-llm-operator"), children, "<fullname>")
    compare(rules_of(docs, "Role", "rel-llm-operator-leader-election"), leases, "<fullname>-leader-election")


async def test_the_recorder_sees_what_a_request_needs() -> None:
    """The derivation itself: server-side apply needs create too, a status patch is the subresource."""
    recorder = Recorder()
    kube = Kube(client=cast(AsyncClient, recorder))
    await kube.apply(meta("Service"))
    await kube.patch_status("n", "x", {})
    assert recorder.seen == {
        Permission("", "services", "patch"),
        Permission("", "services", "create"),
        Permission("llmoperator.io", "llmdeployments/status", "patch"),
    }
