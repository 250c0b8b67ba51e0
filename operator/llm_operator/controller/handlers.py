"""kopf wiring: settings in one place, LLMDeployment events into the work queue, background tasks.

Handlers stay thin: they only enqueue. `on.event` keeps no per-object state in annotations and
adds no finalizer, so `kubectl delete` never hangs while the operator is down; children are
removed by the garbage collector through their ownerReferences.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable
from typing import Any

import kopf
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.resources.discovery_v1 import EndpointSlice

from llm_operator import labels as L
from llm_operator.api import v1alpha1 as api
from llm_operator.controller.cluster.kube import (
    CHILD_KINDS,
    HTTP_ROUTE_CRD,
    INFERENCE_POOL_CRD,
    SCALED_OBJECT_CRD,
    Kube,
)
from llm_operator.controller.cluster.leader import Term
from llm_operator.controller.cluster.namespaces import NamespaceScope
from llm_operator.controller.config import OperatorConfig
from llm_operator.controller.reconciler import Reconciler
from llm_operator.controller.status.status import REFUSED
from llm_operator.render.rollout import REVISION_SERVICE_COMPONENT, SNAPSHOT_COMPONENT

log = logging.getLogger(__name__)
# Child kinds whose API may come and go while the operator runs (installed after it, or removed).
OPTIONAL_APIS = {
    "ScaledObject": SCALED_OBJECT_CRD,
    "HTTPRoute": HTTP_ROUTE_CRD,
    "InferencePool": INFERENCE_POOL_CRD,
}
LIST_TIMEOUT_SECONDS = 60  # a watch that cannot list (RBAC, an API gone) must not stop all work


class Runtime:
    """What the handlers share: set up in on.startup, torn down in on.cleanup."""

    config: OperatorConfig | None = None
    term: Term = Term(asyncio.Event())  # leader election's fence and step-down (controller/cluster/leader.py)
    reconciler: Reconciler | None = None
    scope: NamespaceScope = NamespaceScope(())
    tasks: list[asyncio.Task[None]] = []


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.level = logging.WARNING  # lasting state is in conditions; we post our own Events
    settings.persistence.finalizer = f"{api.GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=api.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=api.GROUP)
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 30
    config = Runtime.config or OperatorConfig.from_env()
    kube = Kube(fence=Runtime.term.fence)
    reconciler = Reconciler(kube, config)
    Runtime.reconciler = reconciler
    scope = Runtime.scope = NamespaceScope(config.namespaces)
    scopes = scope.watches
    managed = {L.MANAGED_BY: "llm-operator"}
    routable = {**managed, L.COMPONENT: REVISION_SERVICE_COMPONENT}

    def child_handler(kind: str) -> Any:
        async def on_event(event: str, obj: dict[str, Any]) -> None:
            await reconciler.child_event(event, {**obj, "kind": kind})

        return scope.only_in_scope(on_event)

    # LeaderWorkerSets change how multi-node replicas are rendered: that is decided at start.
    reconciler.leader_worker_set = await kube.has_leader_worker_set()
    optional = {"LeaderWorkerSet": reconciler.leader_worker_set}
    optional |= {kind: await kube.has_crd(crd) for kind, crd in OPTIONAL_APIS.items()}
    kinds = {k: r for k, r in CHILD_KINDS.items() if optional.get(k, True)}
    # The StatefulSet controller copies our pod labels onto its own ControllerRevisions: only the
    # operator's revision snapshots are watched.
    selectors = {"ControllerRevision": {**managed, L.COMPONENT: SNAPSHOT_COMPONENT}}
    log.info(
        "multi-node replicas as %s", "LeaderWorkerSets" if reconciler.leader_worker_set else "StatefulSets"
    )
    listed: list[asyncio.Event] = []

    def watch(res: Any, on_event: Any, namespace: str | None, **selectors: Any) -> asyncio.Task[None]:
        done = asyncio.Event()
        listed.append(done)
        return asyncio.create_task(kube.watch(res, on_event, namespace=namespace, listed=done, **selectors))

    children = {
        kind: [watch(res, child_handler(kind), ns, labels=selectors.get(kind, managed)) for ns in scopes]
        for kind, res in kinds.items()
    }

    def watch_later(kind: str) -> Callable[[], list[asyncio.Task[None]]]:
        def start() -> list[asyncio.Task[None]]:
            tasks = [
                asyncio.create_task(
                    kube.watch(CHILD_KINDS[kind], child_handler(kind), namespace=ns, labels=managed)
                )
                for ns in scopes
            ]
            Runtime.tasks.extend(tasks)  # cancelled at cleanup with the rest
            return tasks

        return start

    apis = {
        crd: OptionalApi(watch_later(kind), children.get(kind, [])) for kind, crd in OPTIONAL_APIS.items()
    }
    watches = [
        watch(Node, reconciler.node_event, None),
        *(task for tasks in children.values() for task in tasks),
        *(
            watch(CustomResourceDefinition, api.crd_event, None, fields={"metadata.name": crd})
            for crd, api in apis.items()
        ),
        # Our serving pods only (server-side selector): to recreate broken multi-node groups.
        *(watch(Pod, scope.only_in_scope(reconciler.pod_event), ns, labels=managed) for ns in scopes),
        # The revision Services' EndpointSlices (they carry the Services' labels): what a gateway
        # routes to, so gateway-api weights follow routable addresses, not Ready pods.
        *(
            watch(EndpointSlice, scope.only_in_scope(reconciler.endpoint_event), ns, labels=routable)
            for ns in scopes
        ),
        # Pods the API server refused our StatefulSets and Jobs (Pod Security, quota): only an
        # Event says so. Filtered by the server, so other Events never reach the operator.
        *(
            watch(Event, scope.only_in_scope(reconciler.create_failed), ns, fields={"reason": REFUSED})
            for ns in scopes
        ),
    ]
    settled = asyncio.Event()
    Runtime.tasks = [
        *watches,
        asyncio.create_task(settle_once_listed(listed, settled)),
        *(asyncio.create_task(work_once_settled(reconciler, settled)) for _ in range(config.workers)),
    ]


class OptionalApi:
    """The watches of one optional child kind (KEDA's ScaledObjects, the Gateway API's HTTPRoutes),
    running while its CRD is installed and Established: an API installed after the operator
    started is watched from then on, without a restart (an HTTPRoute's acceptance, a ScaledObject
    deleted by hand), and a removed one stops its watches instead of failing them every 2 s."""

    def __init__(
        self, start: Callable[[], list[asyncio.Task[None]]], running: list[asyncio.Task[None]]
    ) -> None:
        self._start, self._running = start, running

    async def crd_event(self, event: str, crd: dict[str, Any]) -> None:
        established = event != "DELETED" and any(
            c.get("type") == "Established" and c.get("status") == "True"
            for c in (crd.get("status") or {}).get("conditions") or []
        )
        if established and not self._running:
            log.info("%s is installed: watching its objects", crd["metadata"]["name"])
            self._running = self._start()
        elif not established and self._running:
            log.info("%s is gone: its objects are no longer watched", crd["metadata"]["name"])
            for task in self._running:
                task.cancel()
            self._running = []


async def settle_once_listed(listed: list[asyncio.Event], settled: asyncio.Event) -> None:
    """Reconciling starts once every watch has listed what exists: before, the operator would
    apply again what a predecessor left as it should be (restart, new leader), having not seen it
    yet. What exists by then (imported code, kopf's state, the listed caches) mostly lives as long
    as the process: it is frozen out of the garbage collector's full passes, which walked all of
    it every ten seconds or so (130-250 ms at 1,000 deployments, every reconcile and watch stalled
    meanwhile; 80-120 ms frozen). Cycles among it are never collected: bounded by that one heap."""
    try:
        async with asyncio.timeout(LIST_TIMEOUT_SECONDS):
            await asyncio.gather(*(done.wait() for done in listed))
    except TimeoutError:
        log.warning("some watches have not listed within %d s: reconciling anyway", LIST_TIMEOUT_SECONDS)
    gc.freeze()
    settled.set()


async def work_once_settled(reconciler: Reconciler, settled: asyncio.Event) -> None:
    await settled.wait()
    await reconciler.worker()


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    for task in Runtime.tasks:
        task.cancel()
    await asyncio.gather(*Runtime.tasks, return_exceptions=True)
    if Runtime.term.step_down is not None:  # nothing of ours writes any more: hand the Lease over
        await Runtime.term.step_down()


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)
async def deployment_event(
    type: str, namespace: str | None, name: str, event: kopf.RawEvent, **_: Any
) -> None:
    if Runtime.reconciler is not None and namespace is not None and Runtime.scope.includes(namespace):
        body = dict(event["object"])  # the raw object: the reconcile reads it instead of a GET
        Runtime.reconciler.deployment_event(type or "ADDED", namespace, name, body)
