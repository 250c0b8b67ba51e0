"""A broken group is one event (controller/observe/groups.py): when one member fails, the others
of the same world fail too as it ends (the leader after its lost worker, the worker after its
killed launch agent), each seen in its own pod event, before or after the reconcile that reports
the group; only the first is acted on. The pods stay (the leader relaunches the world in place):
a failure of a run that started after the event's first failure ended broke the relaunched world,
a new event."""

from __future__ import annotations

from typing import Any

from llm_operator import labels as L
from llm_operator.controller.observe.groups import LWS_NAME, GroupFailures, wanted
from llm_operator.render.serving import LWS_GROUP_INDEX
from llm_operator.rollout.revision import Slot

NS, NAME = "ns", "tiny-pp"
BEGAN = "2026-11-01T00:00:00Z"  # when the operator began watching: before every fixture's failure


def pod(name: str, uid: str, restarts: int, group: str = "0", ran: tuple[str, str] = ("00:00:00", "00:01:00"),
        **labels: str) -> dict[str, Any]:  # fmt: skip
    """A member; `ran`: when its last failed run started and ended (today, UTC)."""
    started, finished = (f"2026-12-01T{t}Z" for t in ran)
    return {
        "metadata": {"name": name, "namespace": NS, "uid": uid,
                     "labels": {L.DEPLOYMENT: NAME, L.POOL: "main", L.GROUP_INDEX: group, L.GROUP_SIZE: "2",
                                **labels}},
        "status": {"phase": "Running", "containerStatuses": [{"restartCount": restarts, "lastState": {
            "terminated": {"exitCode": 255, "reason": "Error", "message": "agent exited (status 255)",
                           "startedAt": started, "finishedAt": finished}}}]},
    }  # fmt: skip


def test_the_members_of_a_broken_world_that_fail_after_it_are_the_same_event() -> None:
    failures = GroupFailures(BEGAN)
    assert (
        failures.update("MODIFIED", pod(f"{NAME}-0", "l1", 0)) is None
    )  # a running member is only remembered
    assert failures.update("MODIFIED", pod(f"{NAME}-g0-1", "w1", 1)) == (NS, NAME)
    [(group, failure)] = failures.take((NS, NAME))
    assert group[:2] == ("main", 0) and failure.pod == f"{NAME}-g0-1"
    assert failure.why == "exited 255 (Error): agent exited (status 255)"
    # The leader, as the world ends: its run started before the worker's ended.
    assert failures.update("MODIFIED", pod(f"{NAME}-0", "l1", 1, ran=("00:00:00", "00:01:02"))) is None
    assert failures.take((NS, NAME)) == []
    # The same pods, the world relaunched in place: a run started after the event that fails is a
    # new event, and the restart count tells it from the one already seen.
    assert failures.update("MODIFIED", pod(f"{NAME}-0", "l1", 1, ran=("00:00:00", "00:01:02"))) is None
    assert failures.update("MODIFIED", pod(f"{NAME}-0", "l1", 2, ran=("00:01:03", "00:05:00"))) == (NS, NAME)
    [(_, again)] = failures.take((NS, NAME))
    assert again.pod == f"{NAME}-0"
    # ... and its worker, ending with that world, is part of it.
    assert failures.update("MODIFIED", pod(f"{NAME}-g0-1", "w1", 2, ran=("00:01:01", "00:05:01"))) is None
    assert failures.take((NS, NAME)) == []


def test_two_members_failing_before_the_reconcile_are_one_event_and_other_groups_are_apart() -> None:
    failures = GroupFailures(BEGAN)
    failures.update("MODIFIED", pod(f"{NAME}-0", "l1", 1))
    failures.update("MODIFIED", pod(f"{NAME}-g0-1", "w1", 1))
    failures.update("MODIFIED", pod(f"{NAME}-1", "l9", 0, group="1"))
    assert [f.pod for _, f in failures.take((NS, NAME))] == [f"{NAME}-0"]
    assert failures.update("MODIFIED", pod(f"{NAME}-1", "l9", 1, group="1")) == (
        NS,
        NAME,
    )  # group 1 is not group 0
    assert [(g[1], f.pod) for g, f in failures.take((NS, NAME))] == [(1, f"{NAME}-1")]


def test_a_pod_deleted_before_it_ran_is_no_members_failure() -> None:
    """LWS deletes a recreated group's worker StatefulSet with its leader: a replacement worker still
    being created ends Failed, with no container that ran; the member that broke the group is named."""
    failures = GroupFailures(BEGAN)
    pending = pod(f"{NAME}-g0-1", "w2", 0)
    pending["metadata"]["deletionTimestamp"] = "2026-11-30T02:54:00Z"
    pending["status"] = {"phase": "Failed", "containerStatuses": [{"restartCount": 0, "state": {
        "waiting": {"reason": "ContainerCreating"}}}]}  # fmt: skip
    assert failures.update("MODIFIED", pending) is None
    evicted = {**pending, "status": {"phase": "Failed", "reason": "Evicted", "message": "low on memory"}}
    assert failures.update("MODIFIED", {**evicted, "metadata": {**pending["metadata"], "uid": "w3"}}) == (
        NS,
        NAME,
    )
    # The leader, ending with the world the eviction broke: the same event, which names the evicted one.
    assert failures.update("MODIFIED", pod(f"{NAME}-0", "l1", 1)) == (NS, NAME)
    [(_, evicted_first)] = failures.take((NS, NAME))
    assert evicted_first.pod == f"{NAME}-g0-1" and evicted_first.why == "Evicted: low on memory"


def test_a_group_is_wanted_while_its_leader_set_runs_its_index_and_slot() -> None:
    """An aborted canary's slot (its leader StatefulSet pruned) and a group past the replicas are
    being removed; a LeaderWorkerSet's groups are counted on the LWS."""
    sts = {("StatefulSet", NS, NAME): {"metadata": {}, "spec": {"replicas": 2}},
           ("LeaderWorkerSet", NS, "x-lws"): {"metadata": {}, "spec": {"replicas": 1}}}  # fmt: skip
    assert wanted(sts, NS, NAME, ("main", 1, Slot.A), None)
    assert not wanted(sts, NS, NAME, ("main", 2, Slot.A), None)
    assert not wanted(sts, NS, NAME, ("main", 0, Slot.B), None)  # tiny-pp-b: gone
    assert wanted(sts, NS, NAME, ("main", 0, Slot.B), "x-lws")
    assert not wanted(sts, NS, NAME, ("main", 1, Slot.A), "x-lws")
    deleting = {("StatefulSet", NS, NAME): {"metadata": {"deletionTimestamp": "2026-11-30T05:30:00Z"},
                                             "spec": {"replicas": 2}}}  # fmt: skip
    assert not wanted(deleting, NS, NAME, ("main", 0, Slot.A), None)  # pruned, its pods still going


def test_a_member_deleted_by_its_leader_worker_set_counts_and_one_of_a_statefulset_does_not() -> None:
    """A LeaderWorkerSet deletes its group's leader as soon as another member is deleted or
    restarts: that leader, ending Failed while deleted, is the failure it acted on. The same end of
    a StatefulSet's pod was asked for (a scale-down, a removal, the recreation's own deletion)."""
    failures = GroupFailures(BEGAN)
    ended = pod(f"{NAME}-0", "l1", 0)
    ended["metadata"]["deletionTimestamp"] = "2026-11-30T09:40:00Z"
    words = "mpirun: lost the connection to the MPI daemon"
    state = {"terminated": {"exitCode": 1, "reason": "Error", "message": words}}
    ended["status"] = {"phase": "Failed", "containerStatuses": [{"restartCount": 0, "state": state}]}
    assert failures.update("MODIFIED", ended) is None
    labels = {**ended["metadata"]["labels"], LWS_NAME: NAME, LWS_GROUP_INDEX: "0"}
    lws = {**ended, "metadata": {**ended["metadata"], "uid": "l2", "labels": labels}}
    assert failures.update("MODIFIED", lws) == (NS, NAME)
    [(_, failure)] = failures.take((NS, NAME))
    assert failure.leader_worker_set == NAME and "lost the connection" in failure.why


def test_an_operator_that_starts_after_a_failure_ended_leaves_it_to_the_one_that_watched_it() -> None:
    """Pods outlive their failures (the leader restarts in place), and a starting operator lists
    them all: a run that ended before it began watching is not reported again."""
    failures = GroupFailures("2026-12-01T00:02:00Z")
    assert failures.update("ADDED", pod(f"{NAME}-0", "l1", 1, ran=("00:00:00", "00:01:00"))) is None
    assert failures.update("MODIFIED", pod(f"{NAME}-0", "l1", 2, ran=("00:01:05", "00:03:00"))) == (NS, NAME)


def test_a_failure_is_seen_while_the_kubelet_backs_off_and_each_run_once() -> None:
    """A container that has just ended (its state terminated, the restart count not raised until
    the back-off ends) is a failure now; the same run, moved to lastState by the restart, is not
    one again."""
    failures = GroupFailures(BEGAN)
    ended = {"exitCode": 1, "reason": "Error", "containerID": "containerd://run-2",
             "startedAt": "2026-12-01T00:01:00Z", "finishedAt": "2026-12-01T00:02:00Z"}  # fmt: skip
    backing_off = pod(f"{NAME}-0", "l1", 1)
    backing_off["status"]["containerStatuses"][0]["state"] = {"terminated": ended}
    assert failures.update("MODIFIED", backing_off) == (NS, NAME)
    restarted = pod(f"{NAME}-0", "l1", 2)
    restarted["status"]["containerStatuses"][0].update(state={"running": {}}, lastState={"terminated": ended})
    assert failures.update("MODIFIED", restarted) is None
    assert len(failures.take((NS, NAME))) == 1


def test_an_eviction_of_a_member_that_restarted_before_is_a_failure_in_the_pods_words() -> None:
    failures = GroupFailures(BEGAN)
    assert failures.update("MODIFIED", pod(f"{NAME}-g0-1", "w1", 1)) == (NS, NAME)
    failures.take((NS, NAME))
    evicted = pod(f"{NAME}-g0-1", "w1", 1, ran=("00:02:00", "00:09:00"))
    evicted["status"].update(phase="Failed", reason="Evicted", message="The node was low on memory.")
    assert failures.update("MODIFIED", evicted) == (NS, NAME)
    [(_, failure)] = failures.take((NS, NAME))
    assert failure.why == "Evicted: The node was low on memory.", failure


def test_a_run_that_never_started_and_a_member_that_never_ran_hide_no_later_failure() -> None:
    """A StartError's run is stamped as started in 1970 (kubernetes/kubernetes#120331): it is a
    failure of its own, not one of an earlier world. A member that never ran broke no world, so a
    leader's exit 69 (its workers unreachable) after it is still reported, to be placed anew."""
    failures, worker = GroupFailures(BEGAN), f"{NAME}-g0-1"
    assert failures.update("MODIFIED", pod(worker, "w1", 1, ran=("00:00:00", "00:01:00"))) == (NS, NAME)
    failures.take((NS, NAME))
    start_error = pod(worker, "w1", 2, ran=("00:00:00", "00:02:00"))
    start_error["metadata"]["creationTimestamp"] = "2026-11-30T23:00:00Z"
    [container] = start_error["status"]["containerStatuses"]
    container["lastState"]["terminated"]["startedAt"] = "1970-01-01T00:00:00Z"
    assert failures.update("MODIFIED", start_error) == (NS, NAME)
    failures.take((NS, NAME))
    rejected = pod(worker, "w2", 0)
    rejected["status"] = {"phase": "Failed", "reason": "UnexpectedAdmissionError"}
    assert failures.update("MODIFIED", rejected) == (NS, NAME)
    failures.take((NS, NAME))
    leader = pod(f"{NAME}-0", "l1", 1, ran=("00:00:00", "00:10:00"))
    leader["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] = 69
    assert failures.update("MODIFIED", leader) == (NS, NAME)
    [(_, unformed)] = failures.take((NS, NAME))
    assert unformed.pod == f"{NAME}-0" and unformed.unformed


def test_a_world_breaks_at_its_earliest_failure_whichever_is_seen_first() -> None:
    """The leader ends seconds after its lost worker, and the worker's new run may start before
    then: seen first, the leader's end must not make the worker's new run part of the old world."""
    failures, worker = GroupFailures(BEGAN), f"{NAME}-g0-1"
    assert failures.update("MODIFIED", pod(f"{NAME}-0", "l1", 1, ran=("00:00:00", "00:01:04"))) == (NS, NAME)
    assert failures.update("MODIFIED", pod(worker, "w1", 1, ran=("00:00:00", "00:01:00"))) is None  # the same
    assert [f.pod for _, f in failures.take((NS, NAME))] == [f"{NAME}-0"]
    # The worker's new run started at 00:01:02, after the world broke (00:01:00): its failure is new.
    assert failures.update("MODIFIED", pod(worker, "w1", 2, ran=("00:01:02", "00:07:00"))) == (NS, NAME)
