"""Which watch events wake a reconcile. Each pass renders the deployment again (about 5 ms of the
operator's CPU), and at 2,000 deployments the passes that could change nothing were most of them:
the echo of the operator's own apply and of its own status write, and the disruption controller
rewriting a PodDisruptionBudget's status at every pod event. Whatever a reconcile reads still
wakes it."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from llm_operator.controller.cluster.apply import Applier
from llm_operator.controller.cluster.kube import obj_key

from tests.unit.fake_kube import FakeKube
from tests.unit.test_reconciler import NS, example, operator_with_nodes, reconcile


class EchoingKube(FakeKube):
    """The watch brings each applied object before the apply's response, as it may."""

    def __init__(self) -> None:
        super().__init__()
        self.applier: Applier | None = None
        self.echoes: list[object] = []
        self.answer: dict[str, Any] | None = None  # a controller's status, written before the response

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        result = await super().apply(obj)
        assert self.applier is not None
        self.echoes.append(self.applier.observe("MODIFIED", copy.deepcopy(result)))
        if self.answer is not None:
            answered = self.edit(obj["kind"], NS, obj["metadata"]["name"], status=self.answer)
            self.echoes.append(self.applier.observe("MODIFIED", copy.deepcopy(answered)))
        return result


def statefulset() -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "tiny", "namespace": NS, "labels": {"llmoperator.io/deployment": "tiny"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "tiny"}},
            "template": {"metadata": {"labels": {"app": "tiny"}}},
        },
    }


async def test_the_echo_of_an_apply_wakes_nothing_and_the_controllers_status_does() -> None:
    kube = EchoingKube()
    applier = kube.applier = Applier(kube)
    await applier.apply(statefulset())
    assert kube.echoes == [None], "the event that came before the response: the applying pass reads it"
    k = obj_key(statefulset())
    assert applier.observe("MODIFIED", copy.deepcopy(kube.objects[k])) is None, "the same version again"

    edited = kube.edit("StatefulSet", NS, "tiny", status={"replicas": 1, "readyReplicas": 1})
    assert applier.observe("MODIFIED", copy.deepcopy(edited)) == (NS, "tiny"), "its status is read"
    edited = kube.edit("StatefulSet", NS, "tiny", spec={**edited["spec"], "replicas": 3})
    assert applier.observe("MODIFIED", copy.deepcopy(edited)) == (NS, "tiny"), "drift: restored"
    assert applier.observe("DELETED", copy.deepcopy(edited)) == (NS, "tiny")


async def test_a_controllers_answer_before_the_apply_returns_wakes_the_owner() -> None:
    """The pass that applied decided before the answer (a gateway accepting the route at its new
    generation, which a gateway-api promotion waits for): the next pass must read it."""
    kube = EchoingKube()
    applier = kube.applier = Applier(kube)
    await applier.apply(statefulset())
    kube.echoes.clear()
    kube.answer = {"replicas": 3, "observedGeneration": 2}
    await applier.apply({**statefulset(), "spec": {**statefulset()["spec"], "replicas": 3}})
    assert kube.echoes == [None, (NS, "tiny")], "our apply's echo, then the controller's answer"
    assert applier.children[obj_key(statefulset())]["status"] == kube.answer, "the newer state is kept"


async def test_a_status_no_reconcile_reads_wakes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(example("cpu-reference"))
    await reconcile(kube, reconciler, key)
    woken: list[tuple[str, str]] = []
    monkeypatch.setattr(reconciler.queue, "add", woken.append)

    async def woke(kind: str, name: str, **fields: Any) -> bool:
        woken.clear()
        await reconciler.child_event("MODIFIED", copy.deepcopy(kube.edit(kind, NS, name, **fields)))
        return woken == [key]

    pdb = next(iter(kube.of_kind("PodDisruptionBudget")))
    assert not await woke("PodDisruptionBudget", pdb, status={"currentHealthy": 1, "disruptionsAllowed": 0})
    assert not await woke("Service", key[1], status={"loadBalancer": {}})
    sts = next(iter(kube.of_kind("StatefulSet")))
    assert await woke("StatefulSet", sts, status={"replicas": 1, "readyReplicas": 1})
    assert await woke(
        "PodDisruptionBudget",
        pdb,
        metadata={
            **kube.objects[("PodDisruptionBudget", NS, pdb)]["metadata"],
            "deletionTimestamp": "2026-11-24T00:00:00Z",
        },
    ), "its metadata is read"


async def test_the_echo_of_our_status_write_wakes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pass that writes a status keeps it as the body it reads next; the watch then brings the
    same object at a new resourceVersion. Whatever else changes in it wakes a pass."""
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(example("cpu-reference"))
    reconciler.deployment_event("ADDED", *key, copy.deepcopy(kube.objects[("LLMDeployment", *key)]))
    await kube.deliver(reconciler)
    await reconciler.reconcile(*key)
    woken: list[tuple[str, str]] = []
    monkeypatch.setattr(reconciler.queue, "add", woken.append)

    def watched(**changes: Any) -> bool:
        body = copy.deepcopy(kube.objects[("LLMDeployment", *key)])
        assert body.get("status"), "the pass wrote a status"
        body["metadata"]["resourceVersion"] = str(int(body["metadata"]["resourceVersion"]) + 1)
        body["metadata"]["managedFields"] = [{"manager": "llm-operator", "subresource": "status"}]
        for field, value in changes.items():
            body[field] = {**body[field], **value}
        woken.clear()
        reconciler.deployment_event("MODIFIED", *key, body)
        return woken == [key]

    assert not watched(), "our own status write"
    assert watched(status={"phase": "Ready"}), "a status someone else wrote"
    assert watched(spec={"replicas": 2}), "a spec edit"
    assert watched(metadata={"annotations": {"llmoperator.io/rollout-action": "promote"}}), "an action"
