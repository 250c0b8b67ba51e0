"""Cold starts: measured from a pod's own timestamps (controller/observe/cold_start.py), reported as
status.lastColdStart and one ColdStart Event per start (controller/status/cold_start.py), and through
the reconciler: posted once however many passes follow, and not again by a restarted operator."""

from __future__ import annotations

from typing import Any

from llm_operator import labels as L
from llm_operator.controller.observe.cold_start import ColdStarts, measure
from llm_operator.controller.status.cold_start import ColdStart, report
from llm_operator.controller.status.status import Observation, reduce
from llm_operator.plan.types import PlanningError
from llm_operator.render.serving import LWS_GROUP_INDEX, POD_INDEX

from tests.unit.fake_kube import FakeKube
from tests.unit.test_reconciler import example, operator_with_nodes, reconcile

KEY = ("default", "tiny-llama")


def at(second: int) -> str:
    return f"2026-11-29T10:{second // 60:02d}:{second % 60:02d}Z"


def pod(
    name: str = "tiny-llama-0",
    *,
    uid: str = "u0",
    created: int = 0,
    scheduled: int = 1,
    init_end: int | None = 4,
    started: int = 6,
    ready: int | None = 20,
    restarts: int = 0,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A serving pod as the API server reports it, its timestamps `second`s after 10:00:00."""
    conditions = [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": at(scheduled)},
        {"type": "Initialized", "status": "True", "lastTransitionTime": at(init_end or scheduled)},
    ]
    if ready is not None:
        conditions.append({"type": "Ready", "status": "True", "lastTransitionTime": at(ready)})
    inits = [] if init_end is None else [
        {"name": "inject", "restartCount": 0,
         "state": {"terminated": {"exitCode": 0, "startedAt": at(scheduled), "finishedAt": at(init_end)}}}
    ]  # fmt: skip
    return {
        "metadata": {
            "name": name, "namespace": "default", "uid": uid, "creationTimestamp": at(created),
            "labels": {L.DEPLOYMENT: "tiny-llama", L.POOL: "main", L.SLOT: "a", L.ROLE: "leader",
                       POD_INDEX: name.rpartition("-")[2], **(labels or {})},
        },
        "status": {
            "phase": "Running", "conditions": conditions, "initContainerStatuses": inits,
            "containerStatuses": [{"name": "triton", "restartCount": restarts,
                                   "state": {"running": {"startedAt": at(started)}}}],
        },
    }  # fmt: skip


def test_a_pods_start_is_cut_into_phases_at_the_moments_its_status_records() -> None:
    start = measure(pod())
    assert start is not None
    assert start.phases == (("scheduled", 1), ("initialized", 3), ("started", 2), ("ready", 14))
    assert (start.created, start.ready) == (at(0), at(20))


def test_without_init_containers_the_initialized_condition_ends_that_phase() -> None:
    start = measure(pod(init_end=None, scheduled=2, started=5, ready=9))
    assert start is not None and start.phases == (("scheduled", 2), ("initialized", 0), ("started", 3),
                                                   ("ready", 4))  # fmt: skip


def test_moments_out_of_order_never_make_a_phase_negative_and_the_phases_add_up() -> None:
    """The scheduler's condition and the kubelet's startedAt come from different machines' clocks."""
    start = measure(pod(scheduled=5, init_end=3, started=4, ready=12))
    assert start is not None
    assert start.phases == (("scheduled", 5), ("initialized", 0), ("started", 0), ("ready", 7))
    assert sum(s for _, s in start.phases) == 12


def test_only_a_ready_pod_started_from_nothing_is_measured() -> None:
    assert measure(pod(ready=None)) is None, "not Ready yet"
    assert measure(pod(restarts=1)) is None, "restarted in place: not a start from nothing"
    deleting = pod()
    deleting["metadata"]["deletionTimestamp"] = at(30)
    assert measure(deleting) is None


def group_pod(name: str, uid: str, role: str, ready: int | None, lws: bool = False) -> dict[str, Any]:
    labels = {L.ROLE: role, L.GROUP_SIZE: "2"}
    labels |= (
        {LWS_GROUP_INDEX: "0"} if lws else {L.GROUP_INDEX: "0"} if role == "worker" else {POD_INDEX: "0"}
    )
    p = pod(name, uid=uid, ready=ready, labels=labels)
    if lws and role == "worker":
        p["metadata"]["labels"][POD_INDEX] = "1"  # LWS's worker StatefulSet: the worker's rank
    return p


def test_a_multi_node_group_starts_when_its_slowest_member_is_ready() -> None:
    for lws in (False, True):
        starts = ColdStarts()
        assert starts.update("ADDED", group_pod("m-0", "l", "leader", ready=None, lws=lws)) is None
        assert starts.update("ADDED", group_pod("m-w0-1", "w", "worker", ready=8, lws=lws)) == KEY
        assert starts.pending(KEY) == (), "a group is not up until every member is Ready"
        assert starts.update("MODIFIED", group_pod("m-0", "l", "leader", ready=25, lws=lws)) == KEY
        (start,) = starts.pending(KEY)
        assert (start.pod, start.pods, start.ready_at, start.total) == ("m-0", 2, at(25), 25)
        assert start.message().startswith("group 0 of pool main (2 pods), slowest m-0 started from nothing")


def test_each_start_is_measured_once_and_a_replacement_is_a_new_start() -> None:
    starts = ColdStarts()
    assert starts.update("ADDED", pod()) == KEY
    (first,) = starts.pending(KEY)
    assert not first.seen_starting, "first seen Ready: its start may be a predecessor's to report"
    starts.reported(KEY, (first,))
    assert starts.pending(KEY) == ()
    flapped = pod(ready=90)  # readiness lost and regained: the same pod, not a new start
    assert starts.update("MODIFIED", flapped) is None and starts.pending(KEY) == ()
    assert starts.update("DELETED", flapped) is None
    assert starts.update("ADDED", pod(uid="u1", created=100, ready=None)) is None
    assert starts.update("MODIFIED", pod(uid="u1", created=100, scheduled=101, started=105, ready=130)) == KEY
    (second,) = starts.pending(KEY)
    assert (second.started_at, second.total, second.seen_starting) == (at(100), 30, True)


def cold(pod_name: str, created: int, ready: int, seen_starting: bool = False) -> ColdStart:
    phases = (("ready", ready - created),)
    return ColdStart(
        pod_name + str(created), pod_name, 1, at(created), at(ready), phases, seen_starting=seen_starting
    )


def test_status_keeps_the_latest_start_and_an_event_goes_to_each_new_one_once() -> None:
    a, b = cold("tiny-llama-0", 0, 20), cold("tiny-llama-1", 0, 25)
    last, news = report((b, a), None)
    assert news == [a, b] and last == b.fields()
    assert last["totalSeconds"] == 25 and last["phases"] == [{"name": "ready", "seconds": 25}]
    # A restarted operator finds both pods Ready, unreported as far as it knows: nothing is news,
    # not even a third Ready in the same second as the one kept; one Ready later is.
    c, d = cold("tiny-llama-2", 3, 25), cold("tiny-llama-3", 5, 26)
    assert report((a, b, c), {"lastColdStart": last}) == (last, [])
    assert report((a, d), {"lastColdStart": last}) == (d.fields(), [d])
    # What this operator saw starting is news whenever it became Ready.
    e = cold("tiny-llama-2", 3, 25, seen_starting=True)
    assert report((e,), {"lastColdStart": last}) == (e.fields(), [e])
    f = cold("tiny-llama-4", 0, 24, seen_starting=True)
    assert report((f,), {"lastColdStart": last}) == (last, [f]), "status keeps the latest"


def test_the_reducer_writes_last_cold_start_and_keeps_it_through_passes_that_measure_nothing() -> None:
    start = cold("tiny-llama-0", 0, 20)
    obs = Observation(1, PlanningError("NoFit", "nothing fits"), cold_starts=(start,))
    status, events = reduce(obs, None, at(30))
    assert status["lastColdStart"]["podName"] == "tiny-llama-0"
    assert [(e.type, e.reason) for e in events if e.reason == "ColdStart"] == [("Normal", "ColdStart")]
    again, events = reduce(Observation(1, PlanningError("NoFit", "nothing fits")), status, at(40))
    assert again["lastColdStart"] == status["lastColdStart"] and not [
        e for e in events if e.reason == "ColdStart"
    ]


async def test_the_reconciler_posts_each_start_once_and_a_restarted_operator_none_again() -> None:
    kube, reconciler = await operator_with_nodes()
    body = example("cpu-reference")
    body["spec"]["replicas"] = 2
    key = kube.add_deployment(body)
    await reconcile(kube, reconciler, key)
    pods = [pod(), pod("tiny-llama-1", uid="u1")]  # Ready in the same second
    for p in pods:
        await reconciler.pod_event("ADDED", {**p, "status": {"phase": "Pending"}})
        await reconciler.pod_event("MODIFIED", p)
    assert len(reconciler.queue) == 1, "a newly measured start wakes its deployment"
    for _ in range(3):
        await reconcile(kube, reconciler, key)
    said = "started from nothing in 20 s: scheduled 1 s, initialized 3 s, started 2 s, ready 14 s"
    assert [e for e in kube.events if e[1] == "ColdStart"] == [
        ("Normal", "ColdStart", f"pod tiny-llama-0 {said}"),
        ("Normal", "ColdStart", f"pod tiny-llama-1 {said}"),
    ]
    status = kube.objects[("LLMDeployment", *key)]["status"]
    assert (status["lastColdStart"]["podName"], status["lastColdStart"]["totalSeconds"]) == (
        "tiny-llama-1",
        20,
    )

    restarted = await restart(kube)
    for p in pods:  # the watch lists what runs
        await restarted.pod_event("ADDED", p)
    await reconcile(kube, restarted, key)
    assert len([e for e in kube.events if e[1] == "ColdStart"]) == 2, "posted by its predecessor"


async def restart(kube: FakeKube) -> Any:
    _, reconciler = await operator_with_nodes(kube)
    await kube.list_to(reconciler)
    return reconciler
