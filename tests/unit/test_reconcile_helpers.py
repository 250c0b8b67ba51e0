"""Pure decisions inside the reconcile: drift, rollout completion, Job outcome, engine mounts."""

from __future__ import annotations

from typing import Any

import pytest
from llm_operator.controller.deployment_body import LAST_APPLIED, kept_of_deployment
from llm_operator.controller.metrics import ConditionCounts
from llm_operator.controller.observe.engines import job_state
from llm_operator.controller.observe.observe import (
    MAX_PROBLEM,
    Applied,
    ChildCache,
    CreateFailures,
    PodProblems,
    drifted,
    pod_problem,
    rolled_out,
)
from llm_operator.engine.state import BuildFact, BuildObserved
from llm_operator.rollout.revision import Slot
from llm_operator.storage import engine_location
from prometheus_client import CollectorRegistry, Gauge


def sts(
    generation: int, observed: int, updated: int, replicas: int = 2, same_revision: bool = True
) -> dict[str, Any]:
    return {
        "metadata": {"generation": generation},
        "spec": {"replicas": replicas},
        "status": {
            "observedGeneration": observed,
            "updatedReplicas": updated,
            "currentRevision": "a",
            "updateRevision": "a" if same_revision else "b",
        },
    }


def test_rollout_complete_only_when_controller_caught_up_and_all_pods_updated() -> None:
    applied = Applied("d", 3, None)
    assert rolled_out(sts(3, 3, 2), applied)
    assert not rolled_out(sts(3, 2, 2), applied), "controller has not seen our spec yet"
    assert not rolled_out(sts(3, 3, 1), applied), "a pod still runs the old template"
    assert not rolled_out(sts(3, 3, 2, same_revision=False), applied)
    assert not rolled_out(sts(4, 4, 2), applied), "someone else changed the spec since our apply"


def test_spec_edits_are_drift_status_updates_are_not() -> None:
    applied = Applied("d", 5, None)
    assert not drifted({"metadata": {"generation": 5}, "spec": {"replicas": 3}, "status": {"x": 1}}, applied)
    assert drifted({"metadata": {"generation": 6}, "spec": {"replicas": 1}}, applied)


def test_configmap_and_service_drift_is_compared_by_content() -> None:
    cm = Applied("d", None, {"data": {"a": "1"}})
    assert not drifted({"metadata": {}, "data": {"a": "1"}}, cm)
    assert drifted({"metadata": {}, "data": {"a": "2"}}, cm)
    svc = Applied("d", None, {"spec": {"selector": {"x": "y"}, "ports": [{"port": 8000}]}})
    # Server-filled fields (clusterIP, protocol) are not drift; changed selectors are.
    observed = {
        "metadata": {},
        "spec": {
            "clusterIP": "10.0.0.1",
            "selector": {"x": "y"},
            "ports": [{"port": 8000, "protocol": "TCP"}],
        },
    }
    assert not drifted(observed, svc)
    observed["spec"]["selector"] = {"x": "z"}
    assert drifted(observed, svc)


@pytest.mark.parametrize(
    ("conditions", "state"),
    [
        ([], BuildObserved(BuildFact.RUNNING)),
        ([{"type": "Complete", "status": "True"}], BuildObserved(BuildFact.COMPLETE)),
        (
            [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "OOM"}],
            BuildObserved(BuildFact.FAILED, "BackoffLimitExceeded OOM"),
        ),
        ([{"type": "Failed", "status": "False"}], BuildObserved(BuildFact.RUNNING)),
    ],
)
def test_job_state(conditions: list[dict[str, str]], state: BuildObserved) -> None:
    assert job_state({"status": {"conditions": conditions}}) == state


def test_job_state_absent() -> None:
    assert job_state(None) == BuildObserved(BuildFact.ABSENT)


def test_engine_location_from_pvc_uri() -> None:
    loc = engine_location("pvc://llm-engine-cache/engines/", "llama-fp8-abc")
    assert loc.claim == "llm-engine-cache"
    assert loc.engine_dir == "/engine-cache/engines/llama-fp8-abc"
    assert engine_location("pvc://cache", None).engine_dir == "/engine-cache"
    with pytest.raises(ValueError, match="pvc://"):
        engine_location("s3://bucket/engines", "k")


def test_pod_problem_reads_waiting_reasons_that_need_a_person() -> None:
    def pod(reason: str) -> dict[str, Any]:
        return {"status": {"containerStatuses": [{"state": {"waiting": {"reason": reason, "message": "m"}}}]}}

    assert pod_problem(pod("ImagePullBackOff")) == "ImagePullBackOff: m"
    assert pod_problem(pod("CrashLoopBackOff")) == "CrashLoopBackOff: m"
    assert pod_problem(pod("ContainerCreating")) is None
    assert pod_problem({"status": {}}) is None


def test_pod_problem_reads_init_containers_first() -> None:
    """A build pod's fetch step (an init container) failing, or its image not pulling, is what
    stopped the pod: the main container only waits (PodInitializing) behind it."""
    waiting = {"state": {"waiting": {"reason": "PodInitializing"}}}
    pull = {"state": {"waiting": {"reason": "ImagePullBackOff", "message": "m"}}}
    pulling = {"initContainerStatuses": [pull], "containerStatuses": [waiting]}
    assert pod_problem({"status": pulling}) == "ImagePullBackOff: m"
    fetch = {"state": {"terminated": {"exitCode": 78, "reason": "Error", "message": "engine fetch: cannot"}}}
    failed = {"phase": "Failed", "initContainerStatuses": [fetch], "containerStatuses": [waiting]}
    assert (pod_problem({"status": failed}) or "").endswith("exited 78 (Error): engine fetch: cannot")


def test_pod_problem_gives_the_crash_and_the_schedulers_words() -> None:
    crashed = {
        "status": {
            "containerStatuses": [{
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s restarting"}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                                             "message": "config.pbtxt: unknown field max_batch"}},
            }]
        }
    }  # fmt: skip
    assert pod_problem(crashed) == "CrashLoopBackOff: exited 1 (Error): config.pbtxt: unknown field max_batch"
    unschedulable = {
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                            "message": '0/20 nodes are available: persistentvolumeclaim "m" not found.'}],
        }
    }  # fmt: skip
    assert pod_problem(unschedulable) == (
        'Unschedulable: 0/20 nodes are available: persistentvolumeclaim "m" not found.'
    )
    long = {"type": "PodScheduled", "reason": "Unschedulable", "message": "x" * 5000}
    assert len(pod_problem({"status": {"phase": "Pending", "conditions": [long]}}) or "") <= MAX_PROBLEM


def test_a_launcher_that_refused_to_start_is_told_in_its_own_words_as_soon_as_it_exits() -> None:
    line = "/tokenizer-source/llama/tokenizer.json not found (nor tokenizer.model, vocab.json, vocab.txt)"

    def pod(
        state: dict[str, Any], last: dict[str, Any] | None = None, phase: str = "Running"
    ) -> dict[str, Any]:
        c: dict[str, Any] = {"state": state, **({"lastState": last} if last else {})}
        return {"status": {"phase": phase, "containerStatuses": [c]}}

    refused = {"terminated": {"exitCode": 78, "reason": "Error", "message": line + "\n"}}
    back_off = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s restarting"}}
    # Its first exit (before any back-off), then every crash loop after it.
    assert pod_problem(pod(refused)) == f"LauncherRefused: {line}"
    assert pod_problem(pod(back_off, refused)) == f"LauncherRefused: {line}"
    assert pod_problem(pod({"running": {}}, refused)) is None, "started again: the file may be there now"
    # Bounded however long the message; a build attempt's exit 78 is its Job's to report.
    said = pod_problem(pod(back_off, {"terminated": {"exitCode": 78, "message": "x" * 5000}}))
    assert said is not None and said.startswith("LauncherRefused: x") and len(said) <= MAX_PROBLEM
    assert pod_problem(pod(refused, phase="Failed")) == "Failed: exited 78 (Error): " + line
    assert pod_problem(pod(back_off, {"terminated": {"exitCode": 1, "message": "m"}})) == (
        "CrashLoopBackOff: exited 1 (): m"
    )


def test_pods_the_scheduler_may_yet_place_are_kept_apart_with_the_time_it_first_could_not() -> None:
    def pending(name: str, message: str) -> dict[str, Any]:
        scheduled = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                     "message": message, "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip
        labels = {"llmoperator.io/deployment": "x"}
        return {"metadata": {"name": name, "namespace": "ns", "labels": labels},
                "status": {"phase": "Pending", "conditions": [scheduled]}}  # fmt: skip

    problems = PodProblems()
    full = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
    assert problems.update("ADDED", pending("x-0", full)) == ("ns", "x")
    assert problems.update("MODIFIED", pending("x-0", full)) is None, "nothing new"
    claimless = '0/4 nodes are available: persistentvolumeclaim "engines" not found.'
    problems.update("ADDED", pending("x-1", claimless))
    assert problems.unplaced(("ns", "x")) == ((f"x-0: Unschedulable: {full}", "2026-01-01T00:00:00Z"),)
    assert problems.of(("ns", "x")) == (f"x-1: Unschedulable: {claimless}",), "a missing claim needs a person"
    problems.update("DELETED", pending("x-0", full))
    assert problems.unplaced(("ns", "x")) == ()


def test_pod_problems_per_slot_pending_ones_too_for_the_progress_deadline() -> None:
    """What an aborted canary's reason names: only its own slot's pods, waiting or failing."""

    def pod(name: str, slot: str | None, status: dict[str, Any]) -> dict[str, Any]:
        labels = {"llmoperator.io/deployment": "x", **({"llmoperator.io/slot": slot} if slot else {})}
        return {"metadata": {"name": name, "namespace": "ns", "labels": labels}, "status": status}

    pulling = {"containerStatuses": [{"state": {"waiting": {"reason": "ImagePullBackOff", "message": "no"}}}]}
    pending = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
               "reason": "Unschedulable", "message": "0/4 nodes are available",
               "lastTransitionTime": "2026-01-01T00:00:00Z"}]}  # fmt: skip
    problems = PodProblems()
    problems.update("ADDED", pod("x-0", None, pulling))  # made before slots: slot a
    problems.update("ADDED", pod("x-b-0", "b", pending))
    problems.update("ADDED", pod("x-b-1", "b", pulling))
    assert problems.by_slot(("ns", "x")) == {
        Slot.A: ("x-0: ImagePullBackOff: no",),
        Slot.B: ("x-b-0: Unschedulable: 0/4 nodes are available", "x-b-1: ImagePullBackOff: no"),
    }
    problems.update("DELETED", pod("x-0", None, pulling))
    assert Slot.A not in problems.by_slot(("ns", "x"))


def test_a_long_termination_message_keeps_its_end_on_one_line() -> None:
    """The launcher's last words end with the server's last error: that end is what a person needs."""
    said = (
        "the server exited (status 1)\n"
        + "x" * 2000
        + "\nerror: creating server: failed to load all models\n"
    )
    crashed = {"status": {"containerStatuses": [{
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": said}}}]}}  # fmt: skip
    problem = pod_problem(crashed) or ""
    assert problem.startswith("CrashLoopBackOff: exited 1 (Error): ...xxx")
    assert problem.endswith("xxx; error: creating server: failed to load all models")
    assert len(problem) == MAX_PROBLEM and "\n" not in problem


def test_cached_objects_keep_who_wrote_them_but_not_the_fields_each_owns() -> None:
    from lightkube.resources.core_v1 import ConfigMap
    from llm_operator.controller.cluster.kube import _as_dict

    managed = [
        {"manager": "llm-operator", "operation": "Apply", "fieldsV1": {"f:data": {}}},
        {"manager": "kube-controller-manager", "operation": "Update", "subresource": "status",
         "fieldsV1": {"f:status": {}}},
    ]  # fmt: skip
    meta = {"name": "a", "namespace": "n", "resourceVersion": "7", "managedFields": managed}
    for obj in ({"kind": "ConfigMap", "metadata": dict(meta)}, ConfigMap.from_dict({"metadata": meta})):
        cached = _as_dict(obj)
        assert cached["metadata"]["managedFields"] == [
            {"manager": "llm-operator"}, {"manager": "kube-controller-manager", "subresource": "status"}
        ]  # fmt: skip
        assert cached["metadata"]["resourceVersion"] == "7"


def test_a_failed_build_pod_gives_the_tail_of_its_log_bounded() -> None:
    log = "\n".join(f"step {i}: ok" for i in range(200)) + "\nRuntimeError: CUDA out of memory\n"
    failed = {
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {"state": {"terminated": {"exitCode": 1, "reason": "Error", "message": log}}}
            ],
        }
    }
    problem = pod_problem(failed) or ""
    assert problem.startswith("Failed: exited 1 (Error): ")
    assert problem.endswith("step 199: ok; RuntimeError: CUDA out of memory"), "the end of the log is kept"
    assert "step 0: ok" not in problem and len(problem) <= 500
    succeeded = {
        "status": {"phase": "Succeeded", "containerStatuses": [{"state": {"terminated": {"exitCode": 0}}}]}
    }
    assert pod_problem(succeeded) is None


def test_a_refused_pod_is_reported_until_its_controller_has_created_every_pod() -> None:
    def child(kind: str, uid: str, status: dict[str, Any], replicas: int | None = None) -> dict[str, Any]:
        meta = {"name": "x", "namespace": "ns", "uid": uid, "labels": {"llmoperator.io/deployment": "x"}}
        spec = {"replicas": replicas} if replicas else {}
        return {"kind": kind, "metadata": meta, "spec": spec, "status": status}

    def event(kind: str, uid: str, message: str, reason: str = "FailedCreate") -> dict[str, Any]:
        involved = {"kind": kind, "namespace": "ns", "name": "x", "uid": uid}
        return {"reason": reason, "involvedObject": involved, "message": message}

    refusal = 'create Pod x-1 in StatefulSet x failed error: pods "x-1" is forbidden: exceeded quota: pods'
    failures = CreateFailures()
    sts = child("StatefulSet", "u1", {"replicas": 1}, replicas=2)
    children: dict[Any, dict[str, Any]] = {("StatefulSet", "ns", "x"): sts}
    assert failures.update("ADDED", event("StatefulSet", "u1", refusal), children) == ("ns", "x")
    assert failures.update("MODIFIED", event("StatefulSet", "u1", refusal), children) is None, "no news"
    assert failures.update("ADDED", event("StatefulSet", "u1", "x", reason="FailedDelete"), children) is None
    assert failures.of(children, ("ns", "x")) == (f"x: FailedCreate: {refusal}",)
    assert failures.of(children, ("ns", "other")) == ()

    # Every pod created: the refusal is over, and it is not told again when the Event is relisted.
    children[("StatefulSet", "ns", "x")] = child("StatefulSet", "u1", {"replicas": 2}, replicas=2)
    assert failures.of(children, ("ns", "x")) == ()
    children[("StatefulSet", "ns", "x")] = sts
    assert failures.of(children, ("ns", "x")) == (), "a later shortfall is not an old refusal"
    # A re-created StatefulSet of the same name does not inherit its predecessor's refusal.
    failures.update("ADDED", event("StatefulSet", "u0", refusal), children)
    assert failures.of(children, ("ns", "x")) == ()

    # A build Job: refused until it has a pod or has finished.
    job = child("Job", "j1", {})
    children = {("Job", "ns", "x"): job}
    failures.update("ADDED", event("Job", "j1", "pods forbidden: violates PodSecurity"), children)
    assert failures.of(children, ("ns", "x")) == ("x: FailedCreate: pods forbidden: violates PodSecurity",)
    children[("Job", "ns", "x")] = child("Job", "j1", {"active": 1})
    assert failures.of(children, ("ns", "x")) == ()


def test_the_cache_keeps_what_the_reconcile_reads_and_still_sees_drift() -> None:
    from llm_operator.controller.cluster.apply import cached

    repo: dict[str, Any] = {
        "kind": "ConfigMap",
        "metadata": {"name": "m"},
        "data": {"config.pbtxt": "x" * 17_000, "k": "v"},
    }
    kept = cached(repo)
    assert kept["data"]["k"] == "v" and kept["data"]["config.pbtxt"].startswith("sha256:")
    assert len(str(kept)) < 300 and repo["data"]["config.pbtxt"] == "x" * 17_000, "the input is untouched"
    applied = Applied("d", None, cached(repo))
    assert not drifted(kept, applied)
    edited = {**repo, "data": {**repo["data"], "config.pbtxt": "y" * 17_000}}
    assert drifted(cached(edited), applied), "someone else's edit is still seen"

    template = {"metadata": {"labels": {"llmoperator.io/revision": "r1"}}, "spec": {"containers": [{}] * 9}}
    sts = {
        "kind": "StatefulSet",
        "metadata": {},
        "spec": {"replicas": 2, "selector": {"a": "b"}, "template": template},
    }
    slim = cached(sts)["spec"]
    assert slim == {"replicas": 2, "selector": {"a": "b"},
                    "template": {"metadata": {"labels": {"llmoperator.io/revision": "r1"}}}}  # fmt: skip


def test_the_child_cache_finds_a_deployments_children_through_its_owner_index() -> None:
    def child(kind: str, name: str, owner: str) -> dict[str, Any]:
        return {"kind": kind, "metadata": {"name": name, "namespace": "ns",
                                           "labels": {"llmoperator.io/deployment": owner}}}  # fmt: skip

    cache = ChildCache({("Service", "ns", "a"): child("Service", "a", "a")})
    cache[("StatefulSet", "ns", "a")] = child("StatefulSet", "a", "a")
    cache[("StatefulSet", "ns", "b")] = child("StatefulSet", "b", "b")
    assert [k for k, _ in cache.owned_by(("ns", "a"))] == [("Service", "ns", "a"), ("StatefulSet", "ns", "a")]
    cache[("StatefulSet", "ns", "b")] = child("StatefulSet", "b", "a")  # relabelled: moves
    assert [k for k, _ in cache.owned_by(("ns", "b"))] == []
    assert len(cache.owned_by(("ns", "a"))) == 3
    cache.pop(("Service", "ns", "a"))
    del cache[("StatefulSet", "ns", "a")]
    assert cache.owned_by(("ns", "a")) == [(("StatefulSet", "ns", "b"), cache[("StatefulSet", "ns", "b")])]
    assert len(cache) == 1 and ("Service", "ns", "a") not in cache
    read = cache[("StatefulSet", "ns", "b")]
    read["metadata"]["name"] = "changed"
    assert cache[("StatefulSet", "ns", "b")]["metadata"]["name"] == "b", "a read is a copy"


def test_the_deployments_gauge_moves_by_each_status_written() -> None:
    gauge = Gauge("test_llmdeployments", "t", ["condition", "status"], registry=CollectorRegistry())
    counts = ConditionCounts(gauge)

    def status(ready: str) -> dict[str, Any]:
        return {"conditions": [{"type": "Ready", "status": ready}, {"type": "Stalled", "status": "False"}]}

    def value(ready: str) -> float | None:
        samples = [s for m in gauge.collect() for s in m.samples]
        return next((s.value for s in samples if s.labels == {"condition": "Ready", "status": ready}), None)

    counts.replace(None, status("False"))
    counts.replace(None, status("False"))
    assert (value("False"), value("True")) == (2, None)
    counts.replace(status("False"), status("True"))
    assert (value("False"), value("True")) == (1, 1)
    counts.replace(status("False"), None)  # deleted
    assert (value("False"), value("True")) == (None, 1)


def test_a_watched_deployment_is_kept_without_field_owners_or_the_client_side_copy_of_its_spec() -> None:
    action = {"llmoperator.io/rollout-action": "promote/1"}
    body: dict[str, Any] = {
        "metadata": {"name": "x", "generation": 2, "managedFields": [{"manager": "kubectl", "fieldsV1": {}}],
                     "annotations": {**action, LAST_APPLIED: '{"spec": {}}'}},
        "spec": {"replicas": 1},
        "status": {"observedGeneration": 1},
    }  # fmt: skip
    kept = kept_of_deployment(body)
    assert kept == {"metadata": {"name": "x", "generation": 2, "annotations": action},
                    "spec": {"replicas": 1}, "status": {"observedGeneration": 1}}  # fmt: skip
    assert "managedFields" in body["metadata"], "the event's object is left as it came"
