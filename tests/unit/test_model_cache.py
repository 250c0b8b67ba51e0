"""The model cache, operator side, pure parts: the API's rules (the CEL rules' twins), the keys,
the fetch Job, what desired() holds and renders, reading the fetcher's result and progress, and
what status says."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from llm_operator.api.v1alpha1 import LLMDeployment, LLMDeploymentSpec
from llm_operator.controller.config import OperatorConfig
from llm_operator.controller.observe import model_cache as mc
from llm_operator.controller.status import model_status
from llm_operator.controller.status.status import Observation, reduce
from llm_operator.desired import desired, index_value, plan_for
from llm_operator.engine.state import (
    BuildFact,
    BuildObserved,
    ModelFact,
    ModelObserved,
    ModelState,
    ModelStatus,
)
from llm_operator.images import Images
from llm_operator.modelcache.keys import fetch_key, source_key
from llm_operator.render.model_fetch import fetch_job, model_request
from llm_operator.rollout.revision import Slot

from tests.golden_files import assert_golden
from tests.unit.model_cache_fixtures import CACHED

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "model-fetch"
IMAGES = Images("runtime:1", "cpu-runtime:1", "builder:1", "1.1.0", launcher="launcher:1", fetch="fetch:1")
OWNER = {"apiVersion": "llmoperator.io/v1alpha1", "kind": "LLMDeployment", "name": "tiny", "uid": "u-1",
         "controller": True, "blockOwnerDeletion": True}  # fmt: skip
NOW = "2026-11-26T07:00:00Z"
S3 = {"uri": "s3://models/tiny-llama/", "endpoint": "http://10.240.0.10:7070", "region": "us-east-1",
      "pathStyle": True, "credentialsSecretRef": {"name": "s3-keys"}}  # fmt: skip
CACHE = {"claimName": "llm-model-cache"}


def cpu(source: dict[str, Any], *, name: str = "tiny", **model: Any) -> LLMDeployment:
    return LLMDeployment.model_validate({
        "apiVersion": "llmoperator.io/v1alpha1", "kind": "LLMDeployment",
        "metadata": {"name": name, "namespace": "ns", "uid": "u-1"},
        "spec": {"model": {"name": "llm-operator/tiny-llama", "source": source, **model},
                 "engine": {"backend": "cpu-reference", "maxBatchSize": 8, "maxInputLen": 256,
                            "maxSeqLen": 512, "maxNumTokens": 512}},
    })  # fmt: skip


def model_spec(model: dict[str, Any]) -> LLMDeploymentSpec:
    return LLMDeploymentSpec.model_validate({"model": {"name": "m", **model}})


# --- API ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ({"source": {"uri": "s3://b/m"}, "revision": "v2", "cache": CACHE}, "model.revision is for hf://"),
        ({"source": {"uri": "pvc://c/m"}, "revision": "v2"}, "model.revision is for hf://"),
        ({"source": {"uri": "builtin://tiny-llama"}, "revision": "r7"}, "model.revision is for hf://"),
        ({"source": {"uri": "gs://b/m"}}, "use s3:// with endpoint https://storage.googleapis.com and HMAC"),
        ({"source": {"uri": "s3://b/m"}}, "model.cache.claimName is required for s3:// and hf://"),
        ({"source": {"uri": "hf://org/m"}}, "model.cache.claimName is required"),
        ({"source": {"uri": "pvc://c/m"}, "cache": CACHE}, "model.cache is for s3:// and hf://"),
        ({"source": {"uri": "hf://org/m", "region": "eu-west-1"}, "cache": CACHE},
         "model.source.region is for s3://"),
        ({"source": {"uri": "hf://org/m", "pathStyle": True}, "cache": CACHE}, "model.source.pathStyle is for s3://"),
        ({"source": {"uri": "pvc://c/m", "endpoint": "http://x"}}, "model.source.endpoint is for s3:// and hf://"),
        ({"source": {"uri": "pvc://c/m", "credentialsSecretRef": {"name": "k"}}},
         "credentialsSecretRef is for s3"),
        ({"source": {"uri": "s3://b/m", "endpoint": "http://k:secret@host:7070"}, "cache": CACHE},
         "with no credentials in it"),
        ({"source": {"uri": "s3://AKIA:secret@b/m"}, "cache": CACHE}, "uri must not carry credentials"),
        ({"source": {"uri": "hf://org/m?token=hf_x"}, "cache": CACHE}, "takes no query or fragment"),
        ({"source": {"uri": "hf://org/m#main"}, "cache": CACHE}, "takes no query or fragment"),
    ],
)  # fmt: skip
def test_what_admission_refuses_the_models_refuse_too_naming_the_field(
    model: dict[str, Any], says: str
) -> None:
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(".", r"\.")):
        model_spec(model)


def test_revision_is_hf_only_and_absent_means_main_there() -> None:
    hub = model_spec({"source": {"uri": "hf://org/m"}, "cache": CACHE})
    assert hub.model.revision is None and hub.model.requested_revision == "main"
    pinned = model_spec({"source": {"uri": "hf://org/m"}, "revision": "v1", "cache": CACHE})
    assert pinned.model.requested_revision == "v1"
    s3 = model_spec({"source": S3, "cache": CACHE})
    assert s3.model.requested_revision is None
    assert model_spec({"source": {"uri": "builtin://tiny-llama"}}).model.requested_revision is None


def test_the_cpu_reference_backend_serves_builtin_cached_and_pvc_models() -> None:
    for source in ({"uri": "builtin://tiny-llama"}, {"uri": "pvc://models/tiny"}):
        assert plan_for(cpu(source), None).replicas == 1
    assert plan_for(cpu(S3, cache=CACHE), None).replicas == 1
    assert plan_for(cpu({"uri": "hf://llm-operator/tiny-llama"}, cache=CACHE, revision="v1"), None)


# --- keys ---------------------------------------------------------------------------------------


def test_source_key_is_the_scheme_and_16_hex_of_uri_and_endpoint() -> None:
    digest = hashlib.sha256(b"s3://models/tiny-llama/\nhttp://10.240.0.10:7070").hexdigest()[:16]
    assert source_key("s3://models/tiny-llama/", "http://10.240.0.10:7070") == f"s3-{digest}"
    no_endpoint = hashlib.sha256(b"hf://org/m\n").hexdigest()[:16]
    assert source_key("hf://org/m", None) == f"hf-{no_endpoint}"
    assert source_key("hf://org/m", "http://mirror") != source_key("hf://org/m", None), "a mirror's copy"


def test_fetch_key_names_claim_source_endpoint_and_requested_revision() -> None:
    base = fetch_key("cache", "hf://org/m", None, "main")
    assert len(base) == 16 and int(base, 16) >= 0
    assert base == fetch_key("cache", "hf://org/m", None, "main"), "stable"
    others = {fetch_key("other", "hf://org/m", None, "main"), fetch_key("cache", "hf://org/n", None, "main"),
              fetch_key("cache", "hf://org/m", "http://m", "main"),
              fetch_key("cache", "hf://org/m", None, "v1")}  # fmt: skip
    assert base not in others and len(others) == 4


# --- the fetch Job --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["s3-with-secret", "hf-public"])
def test_fetch_job_matches_golden_and_validates(name: str) -> None:
    ld = cpu(S3, cache=CACHE) if name == "s3-with-secret" else cpu({"uri": "hf://org/tiny"}, cache=CACHE)
    request = model_request(ld.spec)
    assert request is not None
    job = fetch_job(ld.name, ld.namespace, ld.spec, request, image="fetch:1", owner=OWNER,
                    max_bytes_per_second=1048576 if name == "s3-with-secret" else None)  # fmt: skip
    kubernetes_validate.validate(job, "1.34.0", strict=True)
    text = yaml.safe_dump(job, sort_keys=False)
    assert_golden(GOLDEN / f"{name}.yaml", text, f"fetch Job {name}")


def test_the_fetch_job_runs_the_contracts_command_without_a_gpu_and_fails_at_once_on_78() -> None:
    ld = cpu(S3, cache=CACHE)
    request = model_request(ld.spec)
    assert request is not None
    job = fetch_job(
        ld.name, ld.namespace, ld.spec, request, image="fetch:1", owner=OWNER, max_bytes_per_second=5
    )
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["python3", "-m", "llm_operator.modelcache.fetch"]
    assert c["args"] == ["--uri", "s3://models/tiny-llama/", "--source-key", request.source_key,
                         "--cache-root", "/var/lib/llm-operator/model-cache", "--endpoint", "http://10.240.0.10:7070",
                         "--region", "us-east-1", "--path-style", "--max-bytes-per-second", "5"]  # fmt: skip
    assert c["envFrom"] == [{"secretRef": {"name": "s3-keys"}}], "the named Secret, nothing else"
    assert c["terminationMessagePolicy"] == "File"
    assert {"name": "model-cache", "mountPath": "/var/lib/llm-operator/model-cache"} in c["volumeMounts"]
    assert "nvidia.com/gpu" not in json.dumps(job)
    assert c["resources"]["requests"] == {"cpu": "100m", "memory": "128Mi"}
    (rule, _) = job["spec"]["podFailurePolicy"]["rules"]
    assert rule == {
        "action": "FailJob",
        "onExitCodes": {"containerName": "fetch", "operator": "In", "values": [78]},
    }
    assert job["spec"]["backoffLimit"] >= 1, "transient failures are retried, and each retry resumes"
    assert pod["terminationGracePeriodSeconds"] <= 5, "a deleted fetch pod stops, not finishes"
    assert job["metadata"]["name"] == f"tiny-fetch-{request.fetch_key[:10]}"
    hub = cpu({"uri": "hf://org/tiny"}, cache=CACHE)
    hub_request = model_request(hub.spec)
    assert hub_request is not None
    hub_job = fetch_job(hub.name, hub.namespace, hub.spec, hub_request, image="fetch:1", owner=OWNER)
    (hc,) = hub_job["spec"]["template"]["spec"]["containers"]
    assert "envFrom" not in hc and hc["args"][-2:] == ["--revision", "main"]


def test_the_fetcher_parses_the_args_the_job_gives_it() -> None:
    """The fetch Job's command line is the fetcher's own (llm_operator/modelcache/fetch.py, part A)."""
    from llm_operator.modelcache import fetch

    ld = cpu(S3, cache=CACHE)
    request = model_request(ld.spec)
    assert request is not None
    job = fetch_job(
        ld.name, ld.namespace, ld.spec, request, image="fetch:1", owner=OWNER, max_bytes_per_second=5
    )
    (c,) = job["spec"]["template"]["spec"]["containers"]
    a = fetch.parse(c["args"])
    assert (a.uri, a.source_key, a.endpoint, a.region, a.path_style, a.max_bytes_per_second) == (
        S3["uri"], request.source_key, S3["endpoint"], S3["region"], True, 5)  # fmt: skip
    assert a.cache_root == "/var/lib/llm-operator/model-cache" and a.termination_log == "/dev/termination-log"


def test_the_operator_reads_its_bandwidth_cap_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert OperatorConfig.from_env().fetch_max_bytes_per_second is None
    monkeypatch.setenv("LLMOP_FETCH_MAX_BYTES_PER_SECOND", "2097152")
    assert OperatorConfig.from_env().fetch_max_bytes_per_second == 2097152
    monkeypatch.setenv("LLMOP_FETCH_MAX_BYTES_PER_SECOND", "fast")
    with pytest.raises(ValueError, match="positive integer"):
        OperatorConfig.from_env()


# --- desired --------------------------------------------------------------------------------------


def render(ld: LLMDeployment, seen: ModelObserved, slot: Slot = Slot.A) -> Any:
    return desired(ld, plan_for(ld, None), IMAGES, lambda *_: BuildObserved(BuildFact.RECORDED), slot=slot,
                   models=lambda *_: seen)  # fmt: skip


def serving_env(objs: list[dict[str, Any]]) -> dict[str, str]:
    (sts,) = (o for o in objs if o["kind"] == "StatefulSet")
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in c["env"] if "value" in e}


def test_a_model_not_cached_is_fetched_and_every_pool_is_held() -> None:
    ld = cpu(S3, cache=CACHE)
    want = render(ld, ModelObserved(ModelFact.ABSENT))
    (job,) = want.jobs
    assert job["metadata"]["name"].startswith("tiny-fetch-")
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "fetch:1"
    assert want.children == [], "nothing serves before the model is cached"
    assert want.held == {("a", "main")}, "what served before keeps serving"
    assert want.model.state == ModelState.FETCHING and not want.model_record
    running = render(ld, ModelObserved(ModelFact.RUNNING, bytes=1, total_bytes=2))
    assert running.jobs == want.jobs and running.held == want.held
    failed = render(ld, ModelObserved(ModelFact.FAILED, reason="SourceUnauthorized", message="m"))
    assert failed.jobs == [] and failed.children == [] and failed.held == want.held


def test_a_recorded_model_starts_no_job_and_pods_read_it_read_only() -> None:
    ld = cpu(S3, cache=CACHE)
    want = render(ld, CACHED)
    assert want.jobs == [] and not want.model_record and want.held == frozenset()
    directory = f"/var/lib/llm-operator/model-cache/{CACHED.directory}"
    env = serving_env(want.children)
    assert env["LLMOP_MODEL_DIR"] == env["LLMOP_TOKENIZER_DIR"] == directory
    (sts,) = (o for o in want.children if o["kind"] == "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    claim = {"claimName": "llm-model-cache", "readOnly": True}
    assert {"name": "model-cache", "persistentVolumeClaim": claim} in pod["volumes"]
    mount = {"name": "model-cache", "mountPath": "/var/lib/llm-operator/model-cache", "readOnly": True}
    assert mount in pod["containers"][0]["volumeMounts"], "the whole claim, no subPath"
    assert "envFrom" not in pod["containers"][0], "the Secret is the fetch Job's alone"


def test_a_completed_fetch_is_recorded_for_the_namespace() -> None:
    ld = cpu(S3, cache=CACHE)
    done = ModelObserved(ModelFact.COMPLETE, CACHED.directory, CACHED.resolved_revision, 1024, 1024, 4, 4)
    want = render(ld, done)
    request = model_request(ld.spec)
    assert request is not None
    assert want.model_record == {request.fetch_key: index_value(done)}
    assert json.loads(want.model_record[request.fetch_key]) == {
        "directory": CACHED.directory, "resolvedRevision": CACHED.resolved_revision, "bytes": 1024,
        "files": 4}  # fmt: skip
    assert mc.indexed(index_value(done)) == CACHED, "what the next pass reads back"
    assert serving_env(want.children)["LLMOP_MODEL_DIR"].endswith(CACHED.directory)


def test_a_revision_change_holds_the_old_pods_until_the_new_revision_is_cached() -> None:
    v1 = cpu({"uri": "hf://llm-operator/tiny-llama"}, cache=CACHE, revision="v1")
    v2 = cpu({"uri": "hf://llm-operator/tiny-llama"}, cache=CACHE, revision="v2")
    r1, r2 = model_request(v1.spec), model_request(v2.spec)
    assert r1 is not None and r2 is not None and r1.fetch_key != r2.fetch_key, "a new revision: a new fetch"
    old = render(v1, CACHED)
    new = render(v2, ModelObserved(ModelFact.ABSENT))
    assert new.children == [] and ("a", "main") in new.held, "prune keeps v1's StatefulSet"
    (job,) = new.jobs
    assert "--revision" in job["spec"]["template"]["spec"]["containers"][0]["args"]
    v2_cached = ModelObserved(ModelFact.RECORDED, "models/hf-1/" + "2" * 40, "2" * 40)
    assert serving_env(render(v2, v2_cached).children)["LLMOP_MODEL_DIR"] != serving_env(old.children)[
        "LLMOP_MODEL_DIR"]  # fmt: skip


def test_a_pvc_directory_is_read_in_place_without_a_fetch() -> None:
    want = render(cpu({"uri": "pvc://models/tiny-llama/v1"}), ModelObserved(ModelFact.ABSENT))
    assert want.jobs == [] and want.model.state == ModelState.NOT_CACHED
    env = serving_env(want.children)
    assert env["LLMOP_MODEL_DIR"] == env["LLMOP_TOKENIZER_DIR"] == "/checkpoint/tiny-llama/v1"
    builtin = render(cpu({"uri": "builtin://tiny-llama"}), ModelObserved(ModelFact.ABSENT))
    assert "LLMOP_MODEL_DIR" not in serving_env(builtin.children)


# --- reading the fetch ---------------------------------------------------------------------------


def job(condition: str | None = None, when: str = NOW) -> dict[str, Any]:
    status = {"conditions": [{"type": condition, "status": "True", "reason": "BackoffLimitExceeded",
                              "message": "Job has reached the specified backoff limit",
                              "lastTransitionTime": when}]} if condition else {}  # fmt: skip
    return {"kind": "Job", "metadata": {"name": "tiny-fetch-0123456789"}, "status": status}


def pod(message: str = "", phase: str = "Running") -> mc.FetchPod:
    return mc.FetchPod("tiny-fetch-0123456789-abcde", "2026-11-26T06:59:00Z", phase, message)


def test_a_finished_fetch_is_read_from_its_termination_message() -> None:
    result = {"resolvedRevision": "etags-1", "directory": "models/s3-0/etags-1", "bytes": 10, "files": 4,
              "downloadedBytes": 6}  # fmt: skip
    seen = mc.observed(None, job("Complete"), pod(json.dumps(result), "Succeeded"), "k")
    assert seen == ModelObserved(ModelFact.COMPLETE, "models/s3-0/etags-1", "etags-1", 10, 10, 4, 4)
    lost = mc.observed(None, job("Complete"), None, "k")
    assert (lost.fact, lost.reason) == (ModelFact.FAILED, "FetchResultMissing")


def test_a_failed_fetch_carries_the_fetchers_reason_words_and_field() -> None:
    result = {"reason": "SourceUnauthorized", "message": "InvalidAccessKeyId: The AWS Access Key Id you "
              "provided does not exist in our records.",
              "field": "spec.model.source.credentialsSecretRef"}  # fmt: skip
    seen = mc.observed(None, job("Failed"), pod(json.dumps(result), "Failed"), "k")
    assert (seen.fact, seen.reason) == (ModelFact.FAILED, "SourceUnauthorized")
    assert "InvalidAccessKeyId" in seen.message and "spec.model.source.credentialsSecretRef" in seen.message
    crashed = mc.observed(None, job("Failed"), pod("Traceback (most recent call last):", "Failed"), "k")
    assert crashed.reason == "FetchFailed" and "BackoffLimitExceeded" in crashed.message


def test_a_running_fetch_names_its_jobs_start_and_where_its_progress_is() -> None:
    running = job()
    running["status"]["startTime"] = "2026-11-26T06:58:00Z"
    seen = mc.observed(None, running, pod(), "k")
    assert seen == ModelObserved(ModelFact.RUNNING, started="2026-11-26T06:58:00Z")
    message = model_status.fetching_message(ModelStatus(ModelState.FETCHING, "k", "tiny-fetch-k", seen))
    assert "Job tiny-fetch-k started 2026-11-26T06:58:00Z" in message
    assert "kubectl logs job/tiny-fetch-k" in message


def test_the_index_wins_over_any_job_and_an_unreadable_entry_is_fetched_again() -> None:
    index = {"data": {"k": index_value(CACHED)}}
    assert mc.observed(index, None, None, "k") == CACHED
    assert mc.observed({"data": {"k": "sha256:digest"}}, None, None, "k").fact == ModelFact.ABSENT


def test_a_failed_fetch_is_retried_120_s_after_it_failed() -> None:
    assert mc.retry_in(job("Failed", "2026-11-26T06:59:00Z"), NOW) == 60.0
    assert mc.retry_in(job("Failed", "2026-11-26T06:57:00Z"), NOW) <= 0, "due"


def test_fetch_pods_keep_the_newest_attempt_and_wake_their_deployment() -> None:
    pods = mc.FetchPods()

    def fetch_pod(name: str, created: str, message: str = "") -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "ns", "creationTimestamp": created,
                             "labels": {"app.kubernetes.io/component": "model-fetch",
                                        "llmoperator.io/deployment": "tiny",
                                        "batch.kubernetes.io/job-name": "tiny-fetch-0"}},
                "status": {"phase": "Failed" if message else "Running", "containerStatuses": [
                    {"name": "fetch",
                     "state": {"terminated": {"message": message}} if message else {}}]}}  # fmt: skip

    assert pods.update("ADDED", fetch_pod("a", "2026-11-26T06:00:00Z", '{"reason": "X"}')) == ("ns", "tiny")
    assert pods.update("ADDED", fetch_pod("b", "2026-11-26T06:01:00Z")) == ("ns", "tiny")
    assert pods.update("MODIFIED", fetch_pod("a", "2026-11-26T06:00:00Z", '{"reason": "Y"}')) is None
    found = pods.of("ns", "tiny-fetch-0")
    assert found is not None and found.name == "b"
    serving = {
        "metadata": {"name": "tiny-0", "namespace": "ns", "labels": {"llmoperator.io/deployment": "tiny"}}
    }
    assert pods.update("ADDED", serving) is None


# --- status ---------------------------------------------------------------------------------------


def reduced(model: ModelStatus, pod_problems: tuple[str, ...] = ()) -> dict[str, Any]:
    ld = cpu(S3, cache=CACHE)
    status, _ = reduce(Observation(1, plan_for(ld, None), model=model, pod_problems=pod_problems), None, NOW)
    return status


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_status_shows_a_fetch_in_progress() -> None:
    seen = ModelObserved(ModelFact.RUNNING, started="2026-11-26T06:58:00Z")
    status = reduced(ModelStatus(ModelState.FETCHING, "k", "tiny-fetch-k", seen))
    assert status["model"] == {"cacheKey": "k"}
    c = conditions(status)
    assert (c["ModelCached"]["status"], c["ModelCached"]["reason"]) == ("False", "Fetching")
    assert "started 2026-11-26T06:58:00Z" in c["ModelCached"]["message"]
    assert (c["Ready"]["reason"], c["Stalled"]["status"], status["phase"]) == (
        "FetchingModel",
        "False",
        "FetchingModel",
    )


def test_a_failed_fetch_stalls_with_the_fetchers_reason_and_words() -> None:
    seen = ModelObserved(ModelFact.FAILED, reason="SourceNotFound", message="NoSuchBucket: The specified "
                         "bucket does not exist (fix spec.model.source.uri)")  # fmt: skip
    attempt = "tiny-fetch-k-abcde: Failed: exit code 78"
    refused = 'tiny-fetch-k-abcde: LauncherRefused: {"reason": "SourceNotFound"}'  # before the Job fails
    missing = 'tiny-fetch-k-fghij: CreateContainerConfigError: secret "s3-keys" not found'
    status = reduced(ModelStatus(ModelState.FAILED, "k", "tiny-fetch-k", seen), (attempt,))
    fetching = ModelStatus(ModelState.FETCHING, "k", "tiny-fetch-k", ModelObserved(ModelFact.RUNNING))
    assert conditions(reduced(fetching, (refused,)))["Stalled"]["status"] == "False", (
        "the fetcher's, not a launcher's"
    )
    cannot_start = conditions(reduced(fetching, (missing,)))["Stalled"]
    assert (cannot_start["status"], cannot_start["reason"]) == ("True", "MissingObject"), (
        "only the cluster says why"
    )
    c = conditions(status)
    assert (c["Stalled"]["status"], c["Stalled"]["reason"]) == ("True", "SourceNotFound")
    assert "NoSuchBucket: The specified bucket does not exist" in c["Stalled"]["message"]
    assert "tried again every 120 s while the spec is unchanged" in c["ModelCached"]["message"]
    assert c["Ready"]["status"] == "False" and c["ModelCached"]["reason"] == "SourceNotFound"
    assert attempt not in status["message"], "the fetch's own pod is the model's story, not a serving pod's"


def test_a_cached_model_is_in_status_with_its_resolved_revision() -> None:
    status = reduced(ModelStatus(ModelState.READY, "k", "", CACHED))
    assert status["model"]["directory"] == CACHED.directory
    assert status["model"]["resolvedRevision"] == CACHED.resolved_revision
    c = conditions(status)
    assert (c["ModelCached"]["status"], c["ModelCached"]["reason"]) == ("True", "ModelCached")
    assert model_status.fields(ModelStatus(ModelState.NOT_CACHED)) is None
    assert "ModelCached" not in conditions(reduced(ModelStatus(ModelState.NOT_CACHED)))
