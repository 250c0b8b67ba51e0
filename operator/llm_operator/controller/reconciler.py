"""One level-based reconcile per LLMDeployment, driven by a de-duplicating work queue.

Every trigger (the LLMDeployment changed, a child changed or vanished, a pod failed, the GPU
inventory changed) only records what it saw and queues the deployment's key. The reconcile then
reads the current state and converges, without branching on what woke it:

    observe -> desired (pure: plan -> engines -> children) -> apply -> prune -> status

so a missed or duplicated event cannot leave things wrong.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from datetime import UTC, datetime
from typing import Any

from lightkube import ApiError
from pydantic import ValidationError

from llm_operator.api.v1alpha1 import LLMDeployment
from llm_operator.controller import release
from llm_operator.controller.cluster.apply import Applier
from llm_operator.controller.cluster.kube import (
    KubeApi,
    NotLeading,
    merge_patch,
    namespace_terminating,
    obj_key,
)
from llm_operator.controller.cluster.queue import WorkQueue
from llm_operator.controller.config import OperatorConfig
from llm_operator.controller.deployment_body import (
    condition_status,
    first_error,
    kept_of_deployment,
    without_version,
)
from llm_operator.controller.metrics import RECONCILE_ERRORS, RECONCILE_SECONDS, ConditionCounts
from llm_operator.controller.observe import engines
from llm_operator.controller.observe.cold_start import ColdStarts
from llm_operator.controller.observe.groups import GroupFailures, report_broken
from llm_operator.controller.observe.model_cache import ModelCache
from llm_operator.controller.observe.observe import (
    CompactDicts,
    CreateFailures,
    Key,
    PodProblems,
    existing_pools,
    pool_observed,
)
from llm_operator.controller.retries import Retries
from llm_operator.controller.rollout import analysis
from llm_operator.controller.rollout.rollout import Rollout, Rollouts
from llm_operator.controller.secrets.deployment import DeploymentSecrets
from llm_operator.controller.status import autoscaling, hold_status, router_status
from llm_operator.controller.status.status import Event, Observation, reduce, unplaced_recheck_seconds
from llm_operator.desired import Desired, desired, plan_for
from llm_operator.engine.state import ModelFact, ModelObserved
from llm_operator.plan.inventory import Inventory
from llm_operator.plan.types import PlanningError
from llm_operator.release_pin import deployment_images
from llm_operator.render import names
from llm_operator.render.children import serving_selector
from llm_operator.render.network import opened_to_any_source
from llm_operator.render.router.objects import openai_endpoint
from llm_operator.render.scale_to_zero import running_hold
from llm_operator.render.services import endpoints

log = logging.getLogger(__name__)

CLAIM_RECHECK_SECONDS = 15.0  # claims are not watched: look again for one that was missing
KEDA_RECHECK_SECONDS = 30.0  # a ScaledObject (InferencePool) refused for want of its CRDs: try again
# CRDs a cluster may lack (KEDA, the Gateway API, its Inference Extension)
OPTIONAL_KINDS = ("ScaledObject", "HTTPRoute", "InferencePool")
GATEWAY_API_MISSING = (
    "the Gateway API is not installed (no HTTPRoute kind in this cluster): install its standard "
    "CRDs and a Gateway, or use rollout.canary.trafficRouting replica-ratio"
)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Reconciler:
    def __init__(self, kube: KubeApi, config: OperatorConfig) -> None:
        self.kube = kube
        self.config = config
        self.inventory = Inventory()
        self.applier = Applier(kube)
        self.queue = WorkQueue(self._run)
        self.pod_problems = PodProblems()
        self.create_failures = CreateFailures()
        self.group_failures = GroupFailures()
        self.cold_starts = ColdStarts()
        self.secrets = DeploymentSecrets(kube)
        self.models = ModelCache(kube)
        self.rollouts = Rollouts(analysis.measure, config.analysis_prometheus_urls)
        self.statuses: dict[Key, dict[str, Any]] = {}  # last status written, for the gauge
        self.counts = ConditionCounts()
        self.known: set[Key] = set()
        self.bodies: CompactDicts[Key] = CompactDicts()  # each deployment as last watched or written
        self.leader_worker_set = False  # render multi-node replicas as LeaderWorkerSets
        self.retries = Retries(kube, self.queue, self._report)
        # Volume claims seen to exist, with their capacity in bytes (None: not stated).
        self._claims: dict[tuple[str, str], int | None] = {}

    # -- triggers: record what was seen, queue the owner ---------------------------------------

    def deployment_event(
        self, event: str, namespace: str, name: str, body: dict[str, Any] | None = None
    ) -> None:
        """`body`, as the watch brought it, spares the reconcile a GET (one per pass otherwise).
        The echo of our own status write brings nothing new (the pass that wrote it keeps it, see
        `_write_status`): it queues no pass, which at thousands of deployments were two of every
        deployment's five."""
        key = (namespace, name)
        if event == "DELETED":
            self.forget(key)
            return
        self.known.add(key)
        if body is not None:
            kept = kept_of_deployment(body)
            before = self.bodies.get(key)
            self.bodies[key] = kept
            if before is not None and without_version(before) == without_version(kept):
                return
        self.queue.add(key)

    def forget(self, key: Key) -> None:
        """Children go with the owner (garbage collector); drop what we remember of them."""
        self.known.discard(key)
        self.bodies.pop(key, None)
        self.retries.succeeded(key)
        self.counts.replace(self.statuses.pop(key, None), None)
        self.pod_problems.forget(key)
        self.rollouts.forget(key)
        self.group_failures.forget(key)
        self.cold_starts.forget(key)
        self.secrets.forget(key)
        self.applier.forget(key)
        self.queue.forget(key)

    async def child_event(self, event: str, obj: dict[str, Any]) -> None:
        self._wake(self.applier.observe(event, obj))

    async def node_event(self, event: str, node: dict[str, Any]) -> None:
        if event == "DELETED":
            changed = self.inventory.remove(node["metadata"]["name"])
        else:
            changed = self.inventory.upsert(node)
        if changed:
            # Only deployments that could not be placed are re-planned: a running deployment is
            # not moved because a node appeared.
            for key, status in self.statuses.items():
                if condition_status(status, "Stalled") == "True":
                    self.queue.add(key)

    async def pod_event(self, event: str, pod: dict[str, Any]) -> None:
        watchers = (self.pod_problems, self.rollouts.ready, self.group_failures, self.models.pods,
                    self.cold_starts)  # fmt: skip
        for seen in watchers:
            self._wake(seen.update(event, pod))

    async def endpoint_event(self, event: str, endpoint_slice: dict[str, Any]) -> None:
        """An EndpointSlice of a revision Service: what a gateway can route to changed."""
        self._wake(self.rollouts.routable.update(event, endpoint_slice))

    async def create_failed(self, event: str, obj: dict[str, Any]) -> None:
        """A FailedCreate Event: the API server refused one of our controllers a pod."""
        self._wake(self.create_failures.update(event, obj, self.applier.children))

    def _wake(self, key: Key | None) -> None:
        if key is not None and key in self.known:
            self.queue.add(key)

    # -- running a reconcile -------------------------------------------------------------------

    async def worker(self) -> None:
        await self.queue.worker()

    async def _run(self, key: Key) -> None:
        start = time.perf_counter()
        try:
            await self.reconcile(*key)
            self.retries.succeeded(key)
        except NotLeading:
            raise  # not a failure to retry: this replica stops (controller/cluster/leader.py)
        except ApiError as e:
            if namespace_terminating(e):
                # The deployment goes with its namespace (its DELETED event forgets it): there is
                # nothing to retry, and nowhere to write an Event or a status.
                log.info("%s/%s: its namespace is being deleted; not reconciled", *key)
                return
            if e.status.code == 404 and await self.retries.gone(key):
                log.info("%s/%s is gone: forgotten", *key)
                self.forget(key)
                return
            RECONCILE_ERRORS.labels(f"Api{e.status.code}").inc()
            await self.retries.failed(key, f"API error {e.status.code}: {e.status.message}")
        except Exception as e:
            RECONCILE_ERRORS.labels(type(e).__name__).inc()
            log.exception("reconcile of %s/%s failed", *key)
            await self.retries.failed(key, f"{type(e).__name__}: {e}")
        finally:
            RECONCILE_SECONDS.observe(time.perf_counter() - start)

    async def reconcile(self, namespace: str, name: str) -> None:
        body = self.bodies.get((namespace, name)) or await self.kube.get_deployment(namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            self.forget((namespace, name))
            return
        if await report_broken(self.kube, self.applier.children, self.group_failures, body, now()):
            self.secrets.launch.forget((namespace, name))  # a missing Secret fails groups: check again
        try:
            ld = LLMDeployment.model_validate(body)
        except ValidationError as e:
            # Admission normally prevents this (CEL mirrors the models); an object stored under an
            # older CRD can still disagree. Report it; touch nothing that runs.
            error = first_error(e)
            generation = int(body["metadata"].get("generation", 0))
            obs = Observation(generation, PlanningError("InvalidSpec", error), invalid_spec=error)
            await self._write_status(body, obs)
            return
        body, ld = await release.record(self.kube, self.bodies, body, ld, self.config.images)
        builds = lambda ns, key, job: engines.build_observed(self.applier.children, ns, key, job)  # noqa: E731
        try:
            problems = self.pod_problems.by_slot((ld.namespace, ld.name))
            images = deployment_images(ld, self.config.images)  # PlanningError ReleaseUnknown
            rollout = await self.rollouts.decide(ld, images, self.applier.children, problems)
            seen = await self.models.observe(self.applier.children, [s.ld for s in rollout.slots])
            models = lambda *key: seen.get(key, ModelObserved(ModelFact.ABSENT))  # noqa: E731
            applied = self.applier.children.get(("NetworkPolicy", namespace, names.network_policy(name)))
            router = self.applier.children.get(("ConfigMap", namespace, names.router(name)))
            wants = [
                desired(
                    s.ld, plan_for(s.ld, self.inventory, s.images), s.images, builds, slot=s.slot,
                    revision=s.revision, leader_worker_set=self.leader_worker_set,
                    prometheus_url=self.config.prometheus_url, metrics_peers=self.config.metrics_peers,
                    keda_namespace=self.config.keda_namespace, models=models,
                    fetch_max_bytes_per_second=self.config.fetch_max_bytes_per_second,
                    keep_any_source=opened_to_any_source(applied), deployment=ld,
                    canary=rollout.decision.revisions.canary is not None, running_hold=running_hold(router),
                )
                for s in rollout.slots
            ]  # fmt: skip
        except PlanningError as e:
            # Keep whatever serves now; only status and an Event change.
            await self._write_status(body, self._stalled(body, e))
            return
        jobs = [job for want in wants for job in want.jobs]
        needs = [n for want in wants for n in want.claim_needs]
        unusable = await engines.claims_problem(
            self.kube, ld, jobs, needs, self._claims, self.applier.children
        )
        if self.pod_problems.of((namespace, name)):
            self.secrets.admin_keys.forget((namespace, name))  # a deleted Secret is one reason pods fail
        try:
            if unusable is not None:
                raise unusable
            if written := await self.secrets.ensure(ld, [want.plan for want in wants]):
                body = self._status_written(body, written)
            missing_apis = await self._apply(ld, wants, rollout.objects)
        except PlanningError as e:
            # A claim missing, or a Secret or a child's name held by an object the operator did not
            # make: none of them is watched, so look again later.
            await self._write_status(body, self._stalled(body, e))
            self.queue.add_after((namespace, name), CLAIM_RECHECK_SECONDS)
            return
        fetched, model_later = await self.models.settle(self.applier.children, ld, wants, now())
        events = [Event(*e) for e in [*rollout.decision.events, *fetched]]
        observed = self._observe(ld, wants, rollout, missing_apis)
        await self._write_status(body, observed, events)
        self.cold_starts.reported((namespace, name), observed.cold_starts)  # posted with that status
        unplaced = unplaced_recheck_seconds(observed, now())
        later = [t for t in (rollout.decision.requeue_after, unplaced, model_later) if t is not None]
        if missing_apis & {"ScaledObject", "InferencePool"}:
            later.append(KEDA_RECHECK_SECONDS)
        if later:
            self.queue.add_after((namespace, name), min(later))

    async def _apply(self, ld: LLMDeployment, wants: list[Desired], extra: list[dict[str, Any]]) -> set[str]:
        """Apply and prune; returns the optional kinds whose API is missing (KEDA's ScaledObject,
        the Gateway API's HTTPRoute): the rest is applied all the same. PlanningError NameConflict
        when a child's name is held by an object the operator did not make: nothing is applied."""
        objs = wants[0].shared + [o for want in wants for o in want.children] + extra
        await self.applier.check_names(objs)
        for want in wants:
            await engines.record_built(self.kube, ld.namespace, want.record, now())
        for job in (job for want in wants for job in want.jobs):
            # A build is created once: a Job's pod template is immutable, and a spec edit that
            # does not change the engine (its key, so its Job name) must not try to change it.
            if obj_key(job) not in self.applier.children:
                await self.kube.create(job)
        missing = await self.applier.apply_all(objs, OPTIONAL_KINDS)
        keep = {obj_key(o) for o in objs}
        await self.applier.prune((ld.namespace, ld.name), keep, frozenset().union(*(w.held for w in wants)))
        return missing

    # -- observing and reporting ---------------------------------------------------------------

    def _observe(
        self, ld: LLMDeployment, wants: list[Desired], rollout: Rollout, missing_apis: set[str]
    ) -> Observation:
        """The current spec's slot gives plan, engines and pools; the rollout adds the other."""
        children, applied = self.applier.children, self.applier.applied
        scaling = ld.spec.autoscaling
        current, spec = wants[0], rollout.slots[0]
        route_problem = rollout.route_problem
        if "HTTPRoute" in missing_apis:
            route_problem = GATEWAY_API_MISSING
        return Observation(
            ld.generation,
            current.plan,
            engines=current.engines,
            model=current.model,
            pools={
                p.name: pool_observed(children, applied, spec.ld, p, spec.slot) for p in current.plan.pools
            },
            selector=serving_selector(ld.name),
            endpoints=endpoints(ld.name, ld.namespace, openai_endpoint(ld)),
            pod_problems=self.pod_problems.of((ld.namespace, ld.name))
            + self.create_failures.of(children, (ld.namespace, ld.name)),
            unplaced=self.pod_problems.unplaced((ld.namespace, ld.name)),
            autoscaler=None
            if scaling is None
            else autoscaling.observe(
                children, ld.namespace, ld.name, scaling, api_missing="ScaledObject" in missing_apis
            ),
            revisions=rollout.decision.revisions,
            total=ld.spec.replicas,
            route_problem=route_problem,
            router=router_status.observe(
                children, ld, missing_apis, self.applier.missing_words.get("InferencePool", "")
            ),
            release=release.status(spec.ld, spec.images),
            cold_starts=self.cold_starts.pending((ld.namespace, ld.name)),
            hold=hold_status.observe(ld, children.get(("ConfigMap", ld.namespace, names.router(ld.name)))),
        )

    async def _report(self, body: dict[str, Any], failure: PlanningError) -> None:
        await self._write_status(body, self._stalled(body, failure))

    def _stalled(self, body: dict[str, Any], error: PlanningError) -> Observation:
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        return Observation(
            int(body["metadata"].get("generation", 0)),
            error,
            pools=existing_pools(self.applier.children, namespace, name),
            selector=serving_selector(name),
        )

    def _status_written(self, body: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
        """The body with status fields just patched, here and as the next pass reads it: the
        watch's echo of the patch is then no change, and the status written next keeps them."""
        body = {**body, "status": {**(body.get("status") or {}), **fields}}
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if key in self.bodies:
            self.bodies[key] = body
        return body

    async def _write_status(
        self, body: dict[str, Any], obs: Observation, decided: list[Event] | None = None
    ) -> None:
        old = body.get("status") or {}
        status, events = reduce(obs, old, now())
        events = (decided or []) + events
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        changed = json.dumps(status, sort_keys=True) != json.dumps(old, sort_keys=True)
        stamp = now()

        async def tell() -> None:  # in order: `kubectl get events` lists them as they were decided
            for ev in events:
                await self.kube.event(body, ev.type, ev.reason, ev.message, stamp)

        # The Events tell what the status says: sent with it, not a round trip after it (a worker
        # waits for both). A failed patch may leave its Events sent; the retry sends them again.
        writes = [tell()]
        if changed:
            writes.insert(0, self.kube.patch_status(key[0], key[1], merge_patch(old, status)))
        for result in await asyncio.gather(*writes, return_exceptions=True):
            if isinstance(result, BaseException):
                raise result
        if changed and key in self.bodies:  # as the server has it now, before the watch says so
            self.bodies[key] = {**self.bodies[key], "status": status}
        self.counts.replace(self.statuses.get(key), status)
        self.statuses[key] = status
