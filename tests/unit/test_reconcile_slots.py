"""Handler tier: serving objects of an operator before slots, and the slots' pruning rules.

A StatefulSet's selector cannot change, and the slot label is new in it: the applier replaces such
a StatefulSet without stopping its pods (they are relabelled, orphaned and adopted by the new
one). Prune removes what a slot no longer renders, never what another controller owns.
"""

from __future__ import annotations

import copy
from typing import Any

from llm_operator import labels as L
from llm_operator.controller.metrics import REPLACED
from llm_operator.rollout.revision import Slot

from tests.unit.fake_kube import FakeKube
from tests.unit.test_reconciler import NS, example, operator_with_nodes, reconcile


def owned_by(obj: dict[str, Any]) -> list[dict[str, Any]]:
    meta = obj["metadata"]
    return [{"apiVersion": "apps/v1", "kind": obj["kind"], "name": meta["name"], "uid": meta["uid"],
             "controller": True}]  # fmt: skip


def as_before_slots(kube: FakeKube, name: str) -> dict[str, Any]:
    """The StatefulSet as an operator before slots made it, with a running pod and the history
    entry the StatefulSet controller keeps (both carry its template's labels)."""
    sts = kube.objects[("StatefulSet", NS, name)]
    spec = copy.deepcopy(sts["spec"])
    del spec["selector"]["matchLabels"][L.SLOT]
    template_labels = {k: v for k, v in spec["template"]["metadata"]["labels"].items() if k != L.SLOT}
    spec["template"]["metadata"]["labels"] = template_labels
    kube.objects.pop(("StatefulSet", NS, name))
    annotations = {k: v for k, v in sts["metadata"].get("annotations", {}).items() if k != L.APPLIED}
    old = {**sts, "metadata": {**sts["metadata"], "uid": "sts-old", "annotations": annotations}, "spec": spec}
    kube.objects[("StatefulSet", NS, name)] = old
    kube.edit("StatefulSet", NS, name, spec=spec)
    for kind, child in (("Pod", f"{name}-0"), ("ControllerRevision", f"{name}-5d8f7c")):
        kube.objects[(kind, NS, child)] = {
            "kind": kind,
            "metadata": {"name": child, "namespace": NS, "uid": f"{child}-uid", "resourceVersion": "1",
                         "labels": dict(template_labels), "ownerReferences": owned_by(old)},
        }  # fmt: skip
    return old


async def test_a_statefulset_from_before_slots_is_replaced_and_its_pods_keep_running() -> None:
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(example("cpu-reference"))
    await reconcile(kube, reconciler, key)
    as_before_slots(kube, "tiny-llama")
    replaced = REPLACED.labels("StatefulSet")._value.get()
    kube.take_writes()

    await reconcile(kube, reconciler, key)  # the apply is refused (422): replaced, not retried forever
    writes = kube.take_writes()
    assert ("label", "Pod", "tiny-llama-0") in writes and (
        "label",
        "ControllerRevision",
        "tiny-llama-5d8f7c",
    ) in writes
    assert writes.index(("label", "Pod", "tiny-llama-0")) < writes.index(
        ("delete-orphan", "StatefulSet", "tiny-llama")
    )
    assert not [w for w in writes if w[1] == "Pod" and w[0] == "delete"], "no pod is deleted"
    assert REPLACED.labels("StatefulSet")._value.get() == replaced + 1

    await reconcile(kube, reconciler, key)
    sts = kube.objects[("StatefulSet", NS, "tiny-llama")]
    assert sts["spec"]["selector"]["matchLabels"][L.SLOT] == Slot.A
    pod = kube.objects[("Pod", NS, "tiny-llama-0")]
    assert sts["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items(), "adopted"
    history = kube.objects[("ControllerRevision", NS, "tiny-llama-5d8f7c")]
    assert history["metadata"]["labels"][L.SLOT] == Slot.A, "its history is adopted too, not leaked"
    kube.take_writes()
    await reconcile(kube, reconciler, key)
    assert [w for w in kube.take_writes() if w[0] != "status"] == [], "converged: nothing more is written"


async def test_prune_keeps_what_another_controller_owns_and_a_held_slot_pool() -> None:
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(example("cpu-reference"))
    await reconcile(kube, reconciler, key)
    sts = kube.objects[("StatefulSet", NS, "tiny-llama")]
    labels = dict(sts["spec"]["template"]["metadata"]["labels"])
    history = {"kind": "ControllerRevision", "metadata": {
        "name": "tiny-llama-7f9c", "namespace": NS, "uid": "cr-1", "resourceVersion": "1", "labels": labels,
        "ownerReferences": owned_by(sts)}}  # fmt: skip
    kube.objects[("ControllerRevision", NS, "tiny-llama-7f9c")] = history
    slot_b = copy.deepcopy(sts)
    slot_b["metadata"]["name"] = "tiny-llama-b"
    slot_b["metadata"]["labels"][L.SLOT] = Slot.B
    kube.objects[("StatefulSet", NS, "tiny-llama-b")] = slot_b
    await kube.deliver(reconciler)

    await reconciler.applier.prune(key, set(), frozenset({("b", "main")}))
    deleted = {name for verb, kind, name in kube.take_writes() if verb == "delete"}
    assert "tiny-llama-7f9c" not in deleted, "the StatefulSet controller's history is not ours"
    assert "tiny-llama-b" not in deleted, "slot b's pool waits for its engine: what it served stays"
    assert "tiny-llama" in deleted, "slot a's pool is not held"
