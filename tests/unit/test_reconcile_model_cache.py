"""The reconciler and the model cache against an in-memory API: a fetch Job first and nothing
served, the running fetch's Job named in status, the finished fetch recorded for the namespace (a second
deployment starts no Job), a failure Stalled with the fetcher's words and retried."""

from __future__ import annotations

import json
from typing import Any

import pytest
from llm_operator.render.model_fetch import MODEL_INDEX

from tests.unit.fake_kube import FakeKube
from tests.unit.test_reconciler import NS, condition, example, operator_with_nodes, reconcile

S3 = {"uri": "s3://models/tiny-llama/", "endpoint": "http://10.240.0.10:7070", "pathStyle": True,
      "credentialsSecretRef": {"name": "s3-keys"}}  # fmt: skip
RESULT = {"resolvedRevision": "etags-0123456789abcdef", "directory": "models/s3-x/etags-0123456789abcdef",
          "bytes": 2048, "files": 4, "downloadedBytes": 2048}  # fmt: skip


def cached_tiny(name: str = "tiny-llama") -> dict[str, Any]:
    body = example("cpu-reference")
    body["metadata"]["name"] = name
    body["spec"]["model"]["source"] = dict(S3)
    body["spec"]["model"]["cache"] = {"claimName": "llm-model-cache"}
    return body


def fetch_pod(job: str, phase: str, message: str = "") -> dict[str, Any]:
    state = (
        {"terminated": {"exitCode": 0 if phase == "Succeeded" else 78, "message": message}} if message else {}
    )
    return {
        "kind": "Pod",
        "metadata": {"name": f"{job}-x1y2z", "namespace": NS, "creationTimestamp": "2026-11-26T06:00:00Z",
                     "labels": {"app.kubernetes.io/managed-by": "llm-operator",
                                "app.kubernetes.io/component": "model-fetch",
                                "llmoperator.io/deployment": job.split("-fetch-")[0],
                                "batch.kubernetes.io/job-name": job}},
        "status": {"phase": phase, "containerStatuses": [{"name": "fetch", "state": state}]},
    }  # fmt: skip


def job_done(kube: FakeKube, job: str, type_: str, when: str = "2026-11-26T06:00:00Z") -> None:
    done = {"type": type_, "status": "True", "reason": "R", "message": "m", "lastTransitionTime": when}
    kube.edit("Job", NS, job, status={"conditions": [done]})


async def test_a_model_is_fetched_once_then_served_and_a_second_deployment_reuses_it() -> None:
    kube, reconciler = await operator_with_nodes(models_cached=False)
    key = kube.add_deployment(cached_tiny())
    await reconcile(kube, reconciler, key)
    (job,) = kube.of_kind("Job")
    assert job.startswith("tiny-llama-fetch-") and not kube.of_kind("StatefulSet")
    assert condition(kube, "tiny-llama", "Ready")["reason"] == "FetchingModel"
    assert condition(kube, "tiny-llama", "ModelCached")["reason"] == "Fetching"

    # Running: status names the Job and its start (its log, which the operator does not read,
    # has the bytes).
    await reconciler.pod_event("ADDED", fetch_pod(job, "Running"))
    kube.edit("Job", NS, job, status={"startTime": "2026-11-26T05:59:00Z"})
    await reconcile(kube, reconciler, key)
    assert (
        f"Job {job} started 2026-11-26T05:59:00Z" in condition(kube, "tiny-llama", "ModelCached")["message"]
    )

    # Done: recorded for the namespace, an Event, and the pods read the directory.
    await reconciler.pod_event("MODIFIED", fetch_pod(job, "Succeeded", json.dumps(RESULT)))
    job_done(kube, job, "Complete")
    await reconcile(kube, reconciler, key)
    index = kube.objects[("ConfigMap", NS, MODEL_INDEX)]["data"]
    (entry,) = index.values()
    assert json.loads(entry)["directory"] == RESULT["directory"]
    assert any(reason == "ModelFetched" and "etags-0123456789abcdef" in message
               for _, reason, message in kube.events)  # fmt: skip
    (sts,) = kube.of_kind("StatefulSet").values()
    env = {e["name"]: e.get("value") for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["LLMOP_MODEL_DIR"] == f"/var/lib/llm-operator/model-cache/{RESULT['directory']}"
    assert condition(kube, "tiny-llama", "ModelCached")["status"] == "True"
    status = kube.objects[("LLMDeployment", *key)]["status"]
    assert status["model"]["resolvedRevision"] == RESULT["resolvedRevision"]

    # A second deployment of the same source and revision on the same claim: no Job.
    other = kube.add_deployment(cached_tiny("tiny-two"))
    await reconcile(kube, reconciler, other)
    assert [j for j in kube.of_kind("Job") if j.startswith("tiny-two")] == []
    assert "tiny-two" in kube.of_kind("StatefulSet")
    assert condition(kube, "tiny-two", "ModelCached")["status"] == "True"


async def test_a_failed_fetch_stalls_with_the_fetchers_words_and_is_retried_after_120_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kube, reconciler = await operator_with_nodes(models_cached=False)
    key = kube.add_deployment(cached_tiny())
    await reconcile(kube, reconciler, key)
    (job,) = kube.of_kind("Job")
    failure = {"reason": "SourceUnauthorized", "message": "InvalidAccessKeyId: The AWS Access Key Id you "
               "provided does not exist in our records.",
               "field": "spec.model.source.credentialsSecretRef"}  # fmt: skip
    await reconciler.pod_event("MODIFIED", fetch_pod(job, "Failed", json.dumps(failure)))
    job_done(kube, job, "Failed", "2026-11-26T06:00:00Z")
    later: list[float] = []
    monkeypatch.setattr(reconciler.queue, "add_after", lambda _key, delay: later.append(delay))
    monkeypatch.setattr("llm_operator.controller.reconciler.now", lambda: "2026-11-26T06:01:00Z")
    await reconcile(kube, reconciler, key)
    stalled = condition(kube, "tiny-llama", "Stalled")
    assert (stalled["status"], stalled["reason"]) == ("True", "SourceUnauthorized")
    assert "InvalidAccessKeyId" in stalled["message"] and "credentialsSecretRef" in stalled["message"]
    assert "tried again every 120 s" in condition(kube, "tiny-llama", "ModelCached")["message"]
    assert not kube.of_kind("StatefulSet")
    assert job in kube.of_kind("Job") and 59 <= min(later) <= 61, "retried when 120 s have passed"

    # 120 s after it failed: the Job is deleted, and the next pass starts it again.
    monkeypatch.setattr("llm_operator.controller.reconciler.now", lambda: "2026-11-26T06:02:01Z")
    await reconcile(kube, reconciler, key)
    assert ("delete", "Job", job) in kube.writes
    await reconcile(kube, reconciler, key)
    assert job in kube.of_kind("Job"), "a new attempt (a fixed Secret heals without a spec edit)"


async def test_a_missing_model_cache_claim_is_named_before_any_job_starts() -> None:
    kube = FakeKube()
    kube, reconciler = await operator_with_nodes(kube)
    key = kube.add_deployment(cached_tiny())
    await reconcile(kube, reconciler, key)
    stalled = condition(kube, "tiny-llama", "Stalled")
    assert stalled["reason"] == "VolumeClaimNotFound"
    assert 'persistentvolumeclaim "llm-model-cache" not found' in stalled["message"]
    assert "model.cache.claimName" in stalled["message"]
    assert not kube.of_kind("Job")
