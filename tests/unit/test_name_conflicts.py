"""Handler tier: a child's name held by an object the operator did not make is never taken over.

Server-side apply with force would rewrite such an object, add the deployment's controller
reference (the garbage collector then deletes it with the deployment) and prune it later. The
reconciler reads each child's name before its first apply and stops (Stalled NameConflict)
instead. The e2e tier proves it for every kind on a real API server (tests/e2e/test_name_conflicts.py).
"""

from __future__ import annotations

import copy

import pytest
from llm_operator.controller.cluster.apply import PredecessorChildren

from tests.unit.fake_kube import FakeKube
from tests.unit.test_reconciler import example, operator_with_nodes, reconcile

SERVING_KINDS = ("StatefulSet", "LeaderWorkerSet")


def status_of(kube: FakeKube, key: tuple[str, str]) -> dict[str, object]:
    status: dict[str, object] = kube.objects[("LLMDeployment", *key)]["status"]
    return status


async def test_a_foreign_network_policy_under_the_deployments_name_is_left_alone_and_reported() -> None:
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(example("cpu-reference"))
    theirs = {"podSelector": {"matchLabels": {"team": "theirs"}}, "policyTypes": ["Ingress"]}
    foreign = kube.add_foreign("NetworkPolicy", key[0], key[1], spec=theirs)
    before = copy.deepcopy(foreign)

    await reconcile(kube, reconciler, key)

    status = status_of(kube, key)
    conditions = {c["type"]: c for c in status["conditions"]}  # type: ignore[attr-defined]
    assert conditions["Stalled"]["status"] == "True"
    assert conditions["Stalled"]["reason"] == "NameConflict"
    message = conditions["Stalled"]["message"]
    assert f"NetworkPolicy {key[1]} (made by someone else) already exists" in message
    assert "does not take over" in message
    assert ("Warning", "NameConflict") in {(t, r) for t, r, _ in kube.events}
    assert kube.objects[("NetworkPolicy", *key)] == before, "not rewritten, not labelled, not owned"
    assert not any(w[0] == "apply" for w in kube.writes), "nothing applied while a name is taken"
    assert not any(kube.of_kind(k) for k in SERVING_KINDS)

    # Still refused on the next pass; once they delete theirs, the deployment gets its own.
    await reconcile(kube, reconciler, key)
    assert status_of(kube, key)["reason"] == "NameConflict"
    del kube.objects[("NetworkPolicy", *key)]
    kube.unwatched_names.clear()
    await reconcile(kube, reconciler, key)
    ours = kube.objects[("NetworkPolicy", *key)]
    assert ours["metadata"]["ownerReferences"][0]["name"] == key[1]
    assert any(kube.of_kind(k) for k in SERVING_KINDS)
    assert status_of(kube, key)["reason"] != "NameConflict"


async def test_every_taken_name_is_named_and_another_deployments_child_says_whose_it_is() -> None:
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(example("cpu-reference"))
    other = {"kind": "LLMDeployment", "name": "other", "uid": "uid-other", "controller": True}
    kube.add_foreign("Service", key[0], key[1])
    kube.objects[("Service", *key)]["metadata"]["ownerReferences"] = [other]
    kube.add_foreign("NetworkPolicy", key[0], key[1])

    await reconcile(kube, reconciler, key)

    message = status_of(kube, key)["message"]
    assert f"Service {key[1]} (controlled by LLMDeployment other)" in str(message)
    assert f"NetworkPolicy {key[1]} (made by someone else)" in str(message)
    assert "already exist in this namespace" in str(message)


async def test_children_the_deployment_already_owns_are_not_read_again() -> None:
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(example("cpu-reference"))
    await reconcile(kube, reconciler, key)
    first = len(kube.reads)
    assert first > 0, "each new child's name was checked before its first apply"

    await reconcile(kube, reconciler, key)
    _, restarted = await operator_with_nodes(kube)
    await kube.list_to(restarted)  # a new process lists its children first
    await reconcile(kube, restarted, key)
    assert len(kube.reads) == first, "known children cost no read, after a restart neither"
    assert status_of(kube, key)["reason"] != "NameConflict"


async def test_children_of_a_deleted_deployment_of_the_same_name_are_waited_for_not_reported() -> None:
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(example("cpu-reference"))
    predecessor = {"kind": "LLMDeployment", "name": key[1], "uid": "uid-deleted", "controller": True}
    kube.add_foreign("NetworkPolicy", key[0], key[1])
    kube.objects[("NetworkPolicy", *key)]["metadata"]["ownerReferences"] = [predecessor]

    reconciler.deployment_event("ADDED", *key)
    await kube.deliver(reconciler)
    with pytest.raises(PredecessorChildren):  # retried with backoff by the work queue
        await reconciler.reconcile(*key)
    assert not any(w[0] == "apply" for w in kube.writes)
    assert "NameConflict" not in str(kube.objects[("LLMDeployment", *key)].get("status"))
