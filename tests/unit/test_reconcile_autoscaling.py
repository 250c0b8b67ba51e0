"""Handler tier (tests/unit/fake_kube.py): the autoscaler the reconciler applies for each provider,
what it prunes when the provider changes, and what it does without KEDA's API."""

from __future__ import annotations

import copy

import pytest
from llm_operator import labels as L

from tests.unit.fake_kube import FakeKube
from tests.unit.test_reconciler import NS, condition, example, operator_with_nodes, reconcile

NAME = "tiny-llama-keda"


def kedas_hpa(kube: FakeKube) -> None:
    """What KEDA does for our ScaledObject: an HPA it controls, carrying the ScaledObject's labels."""
    scaled = kube.objects[("ScaledObject", NS, NAME)]
    owner = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "name": NAME, "controller": True}
    meta = {"name": f"keda-hpa-{NAME}", "namespace": NS, "generation": 1,
            "labels": dict(scaled["metadata"]["labels"]), "ownerReferences": [owner]}  # fmt: skip
    kube._store(("HorizontalPodAutoscaler", NS, f"keda-hpa-{NAME}"), {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": meta,
        "spec": {"scaleTargetRef": scaled["spec"]["scaleTargetRef"]},
    })  # fmt: skip


@pytest.mark.parametrize("watched", [True, False], ids=["keda-at-start", "keda-installed-later"])
async def test_the_provider_picks_the_autoscaler_and_a_change_prunes_the_other(watched: bool) -> None:
    kube, reconciler = await operator_with_nodes()
    if not watched:  # no watch event tells the operator its ScaledObject is gone
        kube.unwatched_kinds.add("ScaledObject")
    body = example("cpu-reference-keda")
    key = kube.add_deployment(body)
    await reconcile(kube, reconciler, key)
    assert NAME in kube.of_kind("ScaledObject") and NAME not in kube.of_kind("HorizontalPodAutoscaler")
    kedas_hpa(kube)
    await reconcile(kube, reconciler, key)
    assert f"keda-hpa-{NAME}" in kube.of_kind("HorizontalPodAutoscaler"), "KEDA's HPA is not ours to prune"

    spec = copy.deepcopy(kube.objects[("LLMDeployment", *key)]["spec"])
    spec["autoscaling"]["provider"] = "hpa"
    kube.edit("LLMDeployment", *key, spec=spec)
    await reconcile(kube, reconciler, key)
    assert NAME not in kube.of_kind("ScaledObject")
    hpa = kube.of_kind("HorizontalPodAutoscaler")[NAME]
    assert hpa["metadata"]["labels"][L.DEPLOYMENT] == NAME

    spec["autoscaling"]["provider"] = "keda"
    kube.edit("LLMDeployment", *key, spec=spec)
    await reconcile(kube, reconciler, key)
    assert NAME in kube.of_kind("ScaledObject")
    assert set(kube.of_kind("HorizontalPodAutoscaler")) == {f"keda-hpa-{NAME}"}, "our HPA pruned, KEDA's kept"


async def test_without_kedas_api_the_rest_is_applied_and_the_condition_says_so() -> None:
    kube, reconciler = await operator_with_nodes()
    kube.missing_kinds.add("ScaledObject")
    key = kube.add_deployment(example("cpu-reference-keda"))
    await reconcile(kube, reconciler, key)  # no exception: the reconcile succeeded
    assert NAME in kube.of_kind("StatefulSet") and not kube.of_kind("HorizontalPodAutoscaler")
    cond = condition(kube, NAME, "AutoscalingActive")
    assert (cond["status"], cond["reason"]) == ("False", "KedaNotInstalled")
    assert ("Warning", "KedaNotInstalled") in [(t, r) for t, r, _ in kube.events]
    assert condition(kube, NAME, "Stalled")["status"] == "False", "serving is not stalled by autoscaling"

    kube.missing_kinds.clear()  # KEDA installed: the next pass applies the ScaledObject
    await reconcile(kube, reconciler, key)
    assert NAME in kube.of_kind("ScaledObject")
    assert condition(kube, NAME, "AutoscalingActive")["reason"] == "AutoscalerPending"


async def test_a_deployment_at_zero_keeps_a_replica_while_a_canary_runs() -> None:
    """A canary and its stable need a replica each: while a canary runs, the ScaledObject of a
    minReplicas 0 deployment asks for 1 (KEDA raises a target below it), and 0 again once it is over."""
    kube, reconciler = await operator_with_nodes()
    body = example("cpu-reference-scale-to-zero")
    body["spec"]["rollout"] = {"strategy": "canary", "canary": {"steps": [{"weight": 50}]}}
    key = kube.add_deployment(body)
    name = body["metadata"]["name"]
    await reconcile(kube, reconciler, key)
    assert kube.objects[("ScaledObject", NS, name)]["spec"]["minReplicaCount"] == 0

    spec = copy.deepcopy(kube.objects[("LLMDeployment", *key)]["spec"])
    spec["engine"]["maxBatchSize"] = 4  # a new revision: the canary
    kube.edit("LLMDeployment", *key, spec=spec)
    await reconcile(kube, reconciler, key)
    revisions = kube.objects[("LLMDeployment", *key)]["status"]["revisions"]
    assert revisions.get("canary") is not None, revisions
    assert kube.objects[("ScaledObject", NS, name)]["spec"]["minReplicaCount"] == 1

    spec["engine"]["maxBatchSize"] = 8  # back to the stable: the canary is withdrawn
    kube.edit("LLMDeployment", *key, spec=spec)
    await reconcile(kube, reconciler, key)
    assert kube.objects[("LLMDeployment", *key)]["status"]["revisions"].get("canary") is None
    assert kube.objects[("ScaledObject", NS, name)]["spec"]["minReplicaCount"] == 0
