"""What only the cluster knows reaches the user: conditions and Warning Events in the cluster's
own words, within a reconcile of the cluster knowing it, and nothing serving is touched."""

from __future__ import annotations

import re
from typing import Any

import pytest

from e2e.cluster.testing import Kubectl, condition, is_true, wait_for
from tests.e2e.manifests import deployment, engines_claim

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("gpu_pools")]
TIMEOUT = 90


def stalled(kubectl: Kubectl, namespace: str, name: str, reason: str) -> dict[str, Any]:
    ld = wait_for(
        f"{name} Stalled with {reason}",
        lambda: kubectl.get("llmdeployment", name, namespace),
        lambda o: (condition(o, "Stalled") or {}).get("reason") == reason,
        timeout=TIMEOUT,
    )
    assert ld is not None
    found = condition(ld, "Stalled")
    assert found is not None and found["status"] == "True"
    return found


def warning_events(kubectl: Kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    return [
        e for e in kubectl.items("events", namespace)
        if e["involvedObject"]["name"] == name and e["type"] == "Warning"
    ]  # fmt: skip


def building(name: str, source: str, build: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    """A Llama-3.2-1B deployment whose engine is built (on an A10G) into the `engines` claim."""
    engine = {
        "backend": "tensorrt-engine",
        "precision": "bf16",
        "maxBatchSize": 8,
        "maxInputLen": 1024,
        "maxSeqLen": 2048,
        "maxNumTokens": 2048,
        "build": build or {},
        "cache": {"uri": "pvc://engines/cache"},
    }
    model = {"name": "meta-llama/Llama-3.2-1B-Instruct", "source": {"uri": source}}
    return deployment(
        name, engine=engine, model=model, resources={"gpu": {"products": ["NVIDIA-A10G"]}}, **spec
    )


def test_missing_and_too_small_claims_are_named_before_any_build_starts(
    operator: None, kubectl: Kubectl, namespace: str
) -> None:
    body = building("claimless", "pvc://models/llama3.2-1b/")
    kubectl.apply(body, namespace)
    found = stalled(kubectl, namespace, "claimless", "VolumeClaimNotFound")
    assert (
        f'persistentvolumeclaim "models", persistentvolumeclaim "engines" not found in namespace {namespace}'
        in (found["message"])
    )
    assert kubectl.items("jobs", namespace) == [], "no build Job without its claims"
    assert any(e["reason"] == "VolumeClaimNotFound" for e in warning_events(kubectl, namespace, "claimless"))

    def claim(name: str, storage: str) -> dict[str, Any]:
        spec = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": storage}}}
        return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name}, "spec": spec}

    for name in ("models", "engines"):  # what the user does about it; the operator looks again
        kubectl.apply(claim(name, "1Gi"), namespace)
    # Llama 3.2 1B in bf16 read in place: its converted checkpoint and engine, + 10%, are 5.5 GB.
    found = stalled(kubectl, namespace, "claimless", "CacheTooSmall")
    assert 'persistentvolumeclaim "engines" (pvc://engines/cache) holds 1Gi' in found["message"]
    assert "needs 6Gi on it" in found["message"]
    assert kubectl.items("jobs", namespace) == [], "no build Job on a claim that cannot hold it"
    # An unbound claim cannot be resized: a larger one under the same name.
    kubectl.delete("persistentvolumeclaim", "engines", namespace, wait=True)
    kubectl.apply(claim("engines", "8Gi"), namespace)
    (job,) = wait_for(
        "the build Job, once the claims exist and fit",
        lambda: kubectl.items("jobs", namespace),
        bool,
        timeout=60,
    )
    build = job["spec"]["template"]["spec"]["containers"][-1]
    assert build["name"] == "build" and build["resources"]["requests"]["memory"] == "7Gi"


def test_a_serving_pod_the_scheduler_cannot_place_says_why(
    operator: None, kubectl: Kubectl, namespace: str
) -> None:
    # A prebuilt engine on a claim that does not exist: the serving pod stays Pending.
    kubectl.apply(deployment("unplaced", resources={"gpu": {"products": ["NVIDIA-L40S"]}}), namespace)
    found = stalled(kubectl, namespace, "unplaced", "MissingObject")
    assert (
        "Unschedulable" in found["message"]
        and 'persistentvolumeclaim "engines" not found' in found["message"]
    )
    assert any(e["reason"] == "MissingObject" for e in warning_events(kubectl, namespace, "unplaced"))
    assert kubectl.get("statefulset", "unplaced", namespace) is not None, "what was applied stays"


# kwok's chaos stage (e2e/cluster/build-tools.sh) fails the container of a pod with this label the
# way a kubelet reports an exit: terminated, its exit code, reason and message. With
# terminationMessagePolicy FallbackToLogsOnError, that message is the tail of the build's log.
KWOK_FAIL = "pod-container-running-failed.stage.kwok.x-k8s.io"


def test_a_failed_build_says_why_with_the_tail_of_its_log(
    operator: None, kubectl: Kubectl, namespace: str
) -> None:
    engines_claim(kubectl, namespace)
    log_tail = "RuntimeError CUDA out of memory while building layer 31"
    body = building("oom-build", "pvc://engines/models/llama3.2-1b/", {"backoffLimit": 0},
        runtime={"podLabels": {KWOK_FAIL: "true"},
                 "podAnnotations": {f"{KWOK_FAIL}/exit-code": "1", f"{KWOK_FAIL}/reason": "Error",
                                    f"{KWOK_FAIL}/message": log_tail}})  # fmt: skip
    kubectl.apply(body, namespace)
    found = stalled(kubectl, namespace, "oom-build", "EngineBuildFailed")
    (job,) = kubectl.items("jobs", namespace)
    (pod,) = kubectl.items("pods", namespace, f"job-name={job['metadata']['name']}")
    assert pod["metadata"]["labels"][KWOK_FAIL] == "true", "the spec's podLabels reach the build pod"
    assert "BackoffLimitExceeded" in found["message"], "the Job's own words"
    assert f"pod {pod['metadata']['name']} exited 1 (Error): {log_tail}" in found["message"]
    engine_ready = condition(kubectl.get("llmdeployment", "oom-build", namespace), "EngineReady")
    assert engine_ready is not None and log_tail in engine_ready["message"]
    events = warning_events(kubectl, namespace, "oom-build")
    assert any(e["reason"] == "EngineBuildFailed" and log_tail in e["message"] for e in events)
    assert kubectl.items("statefulsets", namespace) == [], "nothing serves a build that failed"


def test_pods_the_api_server_refuses_are_told_in_its_words_and_every_pod_shape_is_restricted(
    operator: None, kubectl: Kubectl, namespace: str
) -> None:
    """A quota refuses a multi-node group's pods: only the StatefulSet controller's FailedCreate
    Event says so. The namespace enforces the restricted Pod Security Standard, so once the quota
    is gone, the pods being created at all proves every shape (leader, worker, build) passes it."""
    kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted",
            "pod-security.kubernetes.io/enforce-version=latest")  # fmt: skip
    engines_claim(kubectl, namespace)
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-pods"},
             "spec": {"hard": {"pods": "0"}}}  # fmt: skip
    kubectl.apply(quota, namespace)
    wait_for("the quota computed", lambda: kubectl.get("resourcequota", "no-pods", namespace),
             lambda o: bool(o and (o.get("status") or {}).get("hard")), timeout=30)  # fmt: skip
    group = deployment("group", parallelism={"tensor": 4, "pipeline": 2},
                       resources={"gpu": {"products": ["NVIDIA-GB200"]}})  # fmt: skip
    kubectl.apply(group, namespace)
    found = stalled(kubectl, namespace, "group", "FailedCreate")
    # The leader's StatefulSet (pod group-0) or group 0's workers' (group-g0-1...): whichever the
    # controller tried first.
    assert "exceeded quota: no-pods" in found["message"], found
    assert re.search(r"create Pod group-(0|g0-\d+) in StatefulSet group(-g0)? ", found["message"]), found
    assert any(
        e["reason"] == "FailedCreate" and "exceeded quota" in e["message"]
        for e in warning_events(kubectl, namespace, "group")
    )
    ld = kubectl.get("llmdeployment", "group", namespace)
    assert ld is not None and ld["status"]["reason"] == "FailedCreate", "the printer column's reason"

    kubectl.delete("resourcequota", "no-pods", namespace)  # what the user does about it
    ready = wait_for("group Ready once its pods may exist",
                     lambda: kubectl.get("llmdeployment", "group", namespace),
                     lambda o: is_true(o, "Ready"), timeout=TIMEOUT)  # fmt: skip
    assert not is_true(ready, "Stalled")
    roles = {p["metadata"]["labels"].get("llmoperator.io/role") for p in kubectl.items("pods", namespace)}
    assert roles == {"leader", "worker"}, roles

    # An engine build's pod, in the same restricted namespace.
    kubectl.apply(building("built", "pvc://engines/models/llama3.2-1b/"), namespace)
    (job,) = wait_for("the build Job", lambda: kubectl.items("jobs", namespace), bool, timeout=60)
    job_pods = f"job-name={job['metadata']['name']}"
    wait_for("its pod, admitted", lambda: kubectl.items("pods", namespace, job_pods), bool, timeout=60)


def test_a_canary_that_never_gets_ready_is_aborted_at_its_deadline_in_the_schedulers_words(
    operator: None, kubectl: Kubectl, namespace: str
) -> None:
    """The canary asks for more CPU than any node has: its pod stays Pending. At the progress
    deadline the rollout aborts, names the pod and the scheduler's reason, and the stable never
    stopped serving; setting the spec back rolls the canary away."""
    engines_claim(kubectl, namespace)
    gpu = {"products": ["NVIDIA-H100-80GB-HBM3"]}
    canary = {"steps": [{"weight": 50, "pauseSeconds": 5}], "progressDeadlineSeconds": 15}
    body = deployment("dl", replicas=2, resources={"gpu": gpu},
                      rollout={"strategy": "canary", "canary": canary})  # fmt: skip
    kubectl.apply(body, namespace)
    wait_for("dl Ready", lambda: kubectl.get("llmdeployment", "dl", namespace),
             lambda o: is_true(o, "Ready"), timeout=TIMEOUT)  # fmt: skip
    body["spec"]["resources"]["cpu"] = "100000"  # a new revision no node can hold
    kubectl.apply(body, namespace)

    found = stalled(kubectl, namespace, "dl", "RolloutAborted")
    ld = kubectl.get("llmdeployment", "dl", namespace)
    assert ld is not None
    revisions = ld["status"]["revisions"]
    assert revisions["phase"] == "Aborted", revisions
    reason = revisions["abortReason"]
    assert reason.startswith("step 1 of 1 (50%): 0 of 1 canary replicas ready after 15 s"), reason
    assert "dl-b-0: Unschedulable:" in reason and "Insufficient cpu" in reason, "the scheduler's words"
    assert reason in found["message"]
    print(f"aborted: {reason}")
    aborted = [
        e["message"] for e in warning_events(kubectl, namespace, "dl") if e["reason"] == "RolloutAborted"
    ]
    assert aborted and reason in aborted[0], aborted
    stable = kubectl.get("statefulset", "dl", namespace)
    assert stable is not None and stable["spec"]["replicas"] == 2
    assert (stable.get("status") or {}).get("readyReplicas") == 2, "the stable served throughout"
    wait_for("the canary's pod removed", lambda: kubectl.items("pods", namespace, "llmoperator.io/slot=b"),
             lambda pods: pods == [], timeout=TIMEOUT)  # fmt: skip

    del body["spec"]["resources"]["cpu"]  # what the user does: the stable revision again
    kubectl.apply(body, namespace)
    ready = wait_for("dl Ready on its stable revision", lambda: kubectl.get("llmdeployment", "dl", namespace),
                     lambda o: is_true(o, "Ready"), timeout=TIMEOUT)  # fmt: skip
    assert ready is not None and not is_true(ready, "Stalled")
    assert "canary" not in ready["status"]["revisions"]
