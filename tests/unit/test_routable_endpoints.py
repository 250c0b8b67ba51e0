"""gateway-api: what a backend can carry is what its revision Service's EndpointSlices list as
ready (what the gateway balances over), not what pods say: a Ready pod reaches the slice and then
the gateway each with a lag, and a backend given weight before that answers 503."""

from __future__ import annotations

from typing import Any

from llm_operator import labels as L
from llm_operator.api.v1alpha1 import LLMDeployment
from llm_operator.controller.observe.observe import ChildCache
from llm_operator.controller.rollout.rollout import ReadyPods, RoutableEndpoints, observe_slots
from llm_operator.rollout.types import Slot, SlotObserved

KEY = ("ns", "tiny")
LD = LLMDeployment.model_validate(
    {
        "metadata": {"name": "tiny", "namespace": "ns"},
        "spec": {"model": {"name": "m", "source": {"uri": "builtin://tiny-llama"}}},
    }
)


def endpoint_slice(name: str, revision: str, *ready: bool) -> dict[str, Any]:
    """A revision Service's EndpointSlice: the Service's labels, one endpoint per `ready` flag."""
    return {
        "metadata": {"name": name, "namespace": "ns",
                     "labels": {L.DEPLOYMENT: "tiny", L.REVISION: revision}},
        "endpoints": [{"addresses": [f"10.0.0.{i}"], "conditions": {"ready": r}}
                      for i, r in enumerate(ready)],
    }  # fmt: skip


def leader(name: str, slot: str, revision: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns",
                     "labels": {L.DEPLOYMENT: "tiny", L.ROLE: "leader", L.SLOT: slot, L.REVISION: revision}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip


def statefulset(slot: str, revision: str, replicas: int, ready: int | None = None) -> dict[str, Any]:
    return {
        "kind": "StatefulSet",
        "metadata": {"name": f"tiny-{slot}", "namespace": "ns",
                     "labels": {L.DEPLOYMENT: "tiny", L.ROLE: "leader", L.SLOT: slot}},
        "spec": {"replicas": replicas, "template": {"metadata": {"labels": {L.REVISION: revision}}}},
        "status": {"readyReplicas": replicas if ready is None else ready},
    }  # fmt: skip


def test_ready_addresses_are_counted_per_revision_once_each() -> None:
    routable = RoutableEndpoints()
    assert routable.update("ADDED", endpoint_slice("tiny-canary-x", "r2")) is None, "empty: nothing changed"
    assert routable.update("MODIFIED", endpoint_slice("tiny-canary-x", "r2", False)) is None
    assert routable.update("MODIFIED", endpoint_slice("tiny-canary-x", "r2", True, False)) == KEY
    assert routable.count(KEY, "r2") == 1 and routable.count(KEY, "r1") == 0
    assert routable.update("MODIFIED", endpoint_slice("tiny-canary-x", "r2", True, False)) is None, (
        "unchanged"
    )
    # After a promotion both revision Services select r2 for a while: the same addresses count once.
    routable.update("MODIFIED", endpoint_slice("tiny-stable-y", "r2", True, True))
    assert routable.count(KEY, "r2") == 2
    routable.update("DELETED", endpoint_slice("tiny-stable-y", "r2", True, True))
    assert routable.count(KEY, "r2") == 1
    routable.forget(KEY)
    assert routable.count(KEY, "r2") == 0


def test_a_ready_pod_counts_for_a_gateway_only_once_its_address_is_routable() -> None:
    children = ChildCache()
    for slot, revision, replicas in (("a", "r1", 2), ("b", "r2", 1)):
        children[("StatefulSet", "ns", f"tiny-{slot}")] = statefulset(slot, revision, replicas)
    pods = ReadyPods()
    for name, slot, revision in (("tiny-0", "a", "r1"), ("tiny-1", "a", "r1"), ("tiny-b-0", "b", "r2")):
        pods.update("MODIFIED", leader(name, slot, revision))
    routable = RoutableEndpoints()
    routable.update("MODIFIED", endpoint_slice("tiny-stable-y", "r1", True, True))

    assert observe_slots(children, LD, pods)[Slot.B] == SlotObserved("r2", 1, 1, True), "replica-ratio: pods"
    gateway = observe_slots(children, LD, pods, routable)
    assert gateway == {Slot.A: SlotObserved("r1", 2, 2, True), Slot.B: SlotObserved("r2", 1, 0, True)}
    routable.update("MODIFIED", endpoint_slice("tiny-canary-x", "r2", True))
    assert observe_slots(children, LD, pods, routable)[Slot.B].ready == 1


def test_a_ready_pod_counts_once_its_statefulset_reports_it() -> None:
    """The pod's event comes before the StatefulSet controller's status: counted early, the
    revision's ready replicas and Ready would change in two status writes instead of one."""
    children = ChildCache()
    children[("StatefulSet", "ns", "tiny-a")] = statefulset("a", "r1", 2, ready=1)
    pods = ReadyPods()
    for name in ("tiny-0", "tiny-1"):
        pods.update("MODIFIED", leader(name, "a", "r1"))
    assert observe_slots(children, LD, pods)[Slot.A].ready == 1
    children[("StatefulSet", "ns", "tiny-a")] = statefulset("a", "r1", 2, ready=2)
    assert observe_slots(children, LD, pods)[Slot.A].ready == 2
    pods.update("DELETED", leader("tiny-1", "a", "r1"))
    assert observe_slots(children, LD, pods)[Slot.A].ready == 1, "nor further than the pods"
