"""A reconcile applies what changed at once: a spec edit reaches the StatefulSet one API round trip
after it, however many children changed (P4 in `make bench`). That is safe because the model
repository a StatefulSet mounts is a new, immutable ConfigMap named by its content, never an
older one rewritten in place. Children that report on others (autoscalers) come after them; the
reconcile workers together keep a bounded number of requests in flight."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from lightkube import ApiError
from lightkube.models.meta_v1 import Status
from llm_operator.controller.cluster.apply import APPLIES_IN_FLIGHT, Applier
from llm_operator.controller.cluster.kube import obj_key
from llm_operator.controller.reconciler import Reconciler

from tests.unit.fake_kube import FakeKube
from tests.unit.test_reconciler import (
    NS,
    cache_examples_models,
    condition,
    example,
    mounted_model_repo,
    operator_with_nodes,
    reconcile,
    rolled_out,
)


class SlowApplies(FakeKube):
    """Each write takes a moment, as on a real API server; records which ones overlapped."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight: set[tuple[str, str]] = set()
        self.overlapped: set[frozenset[tuple[str, str]]] = set()
        self.finished: list[tuple[str, str]] = []
        self.started_after: dict[tuple[str, str], list[tuple[str, str]]] = {}
        self.most_in_flight = 0
        self.refuse: set[tuple[str, str]] = set()  # (kind or "status", name): answered 403

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        kind, _, name = obj_key(obj)
        async with self._sent((kind, name)):
            return await super().apply(obj)

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        async with self._sent(("status", name)):
            await super().patch_status(namespace, name, status)

    async def event(self, involved: dict[str, Any], type_: str, reason: str, message: str, now: str) -> None:
        async with self._sent(("Event", reason)):
            await super().event(involved, type_, reason, message, now)

    @contextlib.asynccontextmanager
    async def _sent(self, me: tuple[str, str]) -> AsyncIterator[None]:
        self.started_after[me] = list(self.finished)
        self.overlapped |= {frozenset({me, other}) for other in self.in_flight}
        self.in_flight.add(me)
        self.most_in_flight = max(self.most_in_flight, len(self.in_flight))
        try:
            await asyncio.sleep(0.01)
            if me in self.refuse:
                raise ApiError(status=Status(code=403, reason="Forbidden", message=f"{me[1]}: no"))
            yield
        finally:
            self.in_flight.discard(me)
            self.finished.append(me)


async def slow_operator() -> tuple[SlowApplies, Reconciler]:
    kube, reconciler = await operator_with_nodes(SlowApplies())
    assert isinstance(kube, SlowApplies)
    kube.add_claim("llm-engine-cache")  # the examples' engine cache
    kube.add_claim("llm-model-cache")
    cache_examples_models(kube)  # and their models, fetched before
    return kube, reconciler


async def test_an_edit_that_changes_the_model_repository_applies_it_with_the_statefulset() -> None:
    kube, reconciler = await slow_operator()
    key = kube.add_deployment(example("cpu-reference"))
    await reconcile(kube, reconciler, key)
    old_repo = mounted_model_repo(kube, "tiny-llama")
    configmap = kube.objects[("ConfigMap", NS, old_repo)]
    assert configmap["immutable"] is True

    body = kube.objects[("LLMDeployment", *key)]  # the batch size is in the model's config.pbtxt
    engine = {**body["spec"]["engine"], "maxBatchSize": 4}
    kube.edit("LLMDeployment", *key, spec={**body["spec"], "engine": engine})
    kube.take_writes()
    await reconcile(kube, reconciler, key)

    new_repo = mounted_model_repo(kube, "tiny-llama")
    assert new_repo != old_repo, "a changed model repository is a new ConfigMap"
    assert frozenset({("ConfigMap", new_repo), ("StatefulSet", "tiny-llama")}) in kube.overlapped
    writes = kube.take_writes()
    assert ("delete", "ConfigMap", old_repo) in writes, "the replaced ConfigMap is pruned"
    assert ("ConfigMap", NS, old_repo) not in kube.objects
    assert [w[2] for w in writes if w[:2] == ("apply", "ConfigMap")] == [new_repo]

    # Unchanged content keeps its name: no new ConfigMap, no write.
    await reconcile(kube, reconciler, key)
    assert mounted_model_repo(kube, "tiny-llama") == new_repo
    assert not [w for w in kube.take_writes() if w[0] != "status"]


async def test_an_autoscaler_is_applied_once_the_workload_it_scales_is() -> None:
    kube, reconciler = await slow_operator()
    body = example("llama3-8b-h100")  # a prebuilt engine: served at once
    body["spec"]["autoscaling"] = example("llama3-70b-fp8")["spec"]["autoscaling"]
    key = kube.add_deployment(body)
    await reconcile(kube, reconciler, key)

    hpa = next(k for k in kube.started_after if k[0] == "HorizontalPodAutoscaler")
    workloads = {k for k in kube.started_after if k[0] == "StatefulSet"}
    assert workloads and workloads <= set(kube.started_after[hpa])
    others = {k for k in kube.started_after if k != hpa}
    assert any(len(pair) == 2 and pair <= others for pair in kube.overlapped), "the rest went together"


async def test_a_deployment_turning_ready_sends_its_status_and_event_together() -> None:
    kube, reconciler = await slow_operator()
    key = kube.add_deployment(example("cpu-reference"))
    await reconcile(kube, reconciler, key)
    rolled_out(kube, "tiny-llama", 1)
    kube.events.clear()

    await reconcile(kube, reconciler, key)
    assert condition(kube, "tiny-llama", "Ready")["status"] == "True"
    [(_, reason, _)] = kube.events
    assert frozenset({("status", "tiny-llama"), ("Event", reason)}) in kube.overlapped

    # A refused status patch fails the pass (retried with backoff) and records no status as written.
    kube.edit("LLMDeployment", *key, spec={**kube.objects[("LLMDeployment", *key)]["spec"], "replicas": 2})
    kube.refuse.add(("status", "tiny-llama"))
    with pytest.raises(ApiError, match="tiny-llama: no"):
        await reconcile(kube, reconciler, key)
    assert reconciler.statuses[key]["observedGeneration"] == 1


def configmap(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NS}, "data": {}}


async def test_requests_in_flight_are_bounded_across_reconciles() -> None:
    kube = SlowApplies()
    applier = Applier(kube)  # one per operator: its reconcile workers share it
    batches = [[configmap(f"c{r}-{i}") for i in range(APPLIES_IN_FLIGHT)] for r in range(3)]
    assert await asyncio.gather(*(applier.apply_all(objs, optional=()) for objs in batches)) == [set()] * 3
    assert kube.most_in_flight == APPLIES_IN_FLIGHT
    assert {obj_key(o) for objs in batches for o in objs} <= set(kube.objects)


async def test_a_refused_child_fails_the_pass_a_missing_optional_api_does_not() -> None:
    kube = SlowApplies()
    kube.missing_kinds.add("ScaledObject")
    scaled = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
              "metadata": {"name": "s", "namespace": NS}, "spec": {}}  # fmt: skip
    applier = Applier(kube)
    assert await applier.apply_all([configmap("a"), scaled], optional=("ScaledObject",)) == {"ScaledObject"}

    kube.refuse.add(("ConfigMap", "b"))
    with pytest.raises(ApiError, match="b: no"):
        await applier.apply_all([configmap("b"), configmap("c"), configmap("d")], optional=())
    assert ("ConfigMap", NS, "c") in kube.objects and ("ConfigMap", NS, "d") in kube.objects
