"""A multi-node group taken away on purpose (the HPA scaling down, an aborted canary's slot) ends
its members, and one may end Failed (a leader whose world lost its worker first, its pod already
terminating): that is no group failure (controller/observe/groups.py `wanted`). Reporting it would
say a group that is gone restarts."""

from __future__ import annotations

from typing import Any

from llm_operator import labels as L

from tests.unit.fake_kube import FakeKube
from tests.unit.test_reconciler import NS, multi_node, operator_with_nodes, reconcile


def ended_failed(name: str, uid: str, group: str, role: str) -> dict[str, Any]:
    """A member of a group being deleted whose container ran and exited non-zero: the kubelet's
    terminal phase for it is Failed."""
    labels = {L.DEPLOYMENT: "llama31-405b", L.POOL: "main", L.ROLE: role, L.GROUP_SIZE: "2"}
    if role == "worker":
        labels[L.GROUP_INDEX] = group
    else:
        labels["apps.kubernetes.io/pod-index"] = group
    ended = {"exitCode": 1, "reason": "Error", "message": "mpirun: rank 1 on the worker exited on signal 15"}
    state = {"restartCount": 0, "state": {"terminated": ended}}
    return {
        "metadata": {"name": name, "namespace": NS, "uid": uid, "labels": labels,
                     "deletionTimestamp": "2026-11-30T05:00:00Z"},
        "status": {"phase": "Failed", "containerStatuses": [state]},
    }  # fmt: skip


def restarted(pod: dict[str, Any]) -> dict[str, Any]:
    """The member as its container restarted in place, its pod not (yet) deleted."""
    [state] = pod["status"]["containerStatuses"]
    meta = {k: v for k, v in pod["metadata"].items() if k != "deletionTimestamp"}
    last = {"restartCount": 1, "lastState": state["state"], "state": {"running": {}}}
    return {"metadata": meta, "status": {"phase": "Running", "containerStatuses": [last]}}


def pod_deletes(kube: FakeKube) -> list[str]:
    return [name for verb, kind, name in kube.take_writes() if verb == "delete" and kind == "Pod"]


async def test_a_group_scaled_away_that_ends_failed_is_not_reported_and_a_kept_one_is() -> None:
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(multi_node())  # 2 replicas: 2 groups
    await reconcile(kube, reconciler, key)
    leader = key[1]
    assert kube.objects[("StatefulSet", NS, leader)]["spec"]["replicas"] == 2
    body = kube.objects[("LLMDeployment", *key)]
    kube.edit("LLMDeployment", NS, leader, spec={**body["spec"], "replicas": 1})  # the HPA, through /scale
    await reconcile(kube, reconciler, key)
    assert kube.objects[("StatefulSet", NS, leader)]["spec"]["replicas"] == 1
    assert ("StatefulSet", NS, f"{leader}-g1") not in kube.objects
    kube.take_writes()
    events = len(kube.events)

    # Its leader, being deleted, ends Failed; or, its worker gone first, restarts before its own
    # deletion comes (`wanted`).
    await reconciler.pod_event("MODIFIED", ended_failed(f"{leader}-1", "l1", "1", "leader"))
    await reconciler.pod_event("MODIFIED", restarted(ended_failed(f"{leader}-1", "l1b", "1", "leader")))
    await reconciler.reconcile(*key)
    assert [e for e in kube.events[events:] if e[1] == "GroupRecreated"] == []

    # Group 0 is still run: its member's failure is one, reported (its leader relaunches it).
    await reconciler.pod_event("MODIFIED", restarted(ended_failed(f"{leader}-g0-1", "w0", "0", "worker")))
    await reconciler.reconcile(*key)
    assert kube.events[-1][1] == "GroupRecreated" and "group 0 of pool main" in kube.events[-1][2]
    assert pod_deletes(kube) == [], "no pod is ever deleted"
