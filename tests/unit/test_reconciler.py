"""Handler tier: the reconciler's decisions against an in-memory API (tests/unit/fake_kube.py).

The e2e tier proves the same paths on a real control plane; here each decision is checked
directly and fast: what gets written, in what order, and what does not get written.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from lightkube import ApiError
from lightkube.models.meta_v1 import Status, StatusCause, StatusDetails
from llm_operator import labels as L
from llm_operator import releases
from llm_operator.api.v1alpha1 import LLMDeployment
from llm_operator.controller.cluster.kube import NotLeading
from llm_operator.controller.cluster.queue import WorkQueue
from llm_operator.controller.config import OperatorConfig
from llm_operator.controller.observe.engines import ENGINE_INDEX
from llm_operator.controller.observe.groups import (
    LAUNCHER_EXIT_WORKERS_UNREACHABLE,
    UNFORMED_GROUP_GRACE_SECONDS,
    GroupFailures,
    why_failed,
)
from llm_operator.controller.reconciler import Reconciler
from llm_operator.controller.retries import REPORT_AFTER_FAILURES
from llm_operator.controller.status.status import UNPLACED_GRACE_SECONDS
from llm_operator.desired import index_value
from llm_operator.render.model_fetch import MODEL_INDEX, model_request

from e2e.cluster.nodes import build_nodes, load_pools
from tests.unit.fake_kube import FakeKube
from tests.unit.model_cache_fixtures import CACHED

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NS = "default"


def example(name: str) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    return body


def cache_examples_models(kube: FakeKube, namespace: str = NS) -> None:
    """The examples' s3:// and hf:// models are in the model cache already (fetched before, by
    any deployment): the index lists them."""
    entries = {}
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if (doc or {}).get("kind") == "LLMDeployment":
                request = model_request(LLMDeployment.model_validate(doc).spec)
                if request is not None:
                    entries[request.fetch_key] = index_value(CACHED)
    kube.add_configmap(namespace, MODEL_INDEX, entries)


async def operator_with_nodes(
    kube: FakeKube | None = None, *, models_cached: bool = True
) -> tuple[FakeKube, Reconciler]:
    """A new operator process, on a new cluster or (restarted) on `kube`. A new cluster's model
    cache holds the examples' models unless `models_cached` is False."""
    if kube is None:
        kube = FakeKube()
        kube.add_claim("llm-engine-cache")  # the examples' engine cache
        kube.add_claim("llm-calibration")  # and calibration dataset
        kube.add_claim("llm-model-cache")  # and model cache
        if models_cached:
            cache_examples_models(kube)
    reconciler = Reconciler(kube, OperatorConfig.from_env())
    for node in build_nodes(load_pools()):
        await reconciler.node_event("ADDED", node)
    return kube, reconciler


async def reconcile(kube: FakeKube, reconciler: Reconciler, key: tuple[str, str]) -> None:
    """One pass as the operator runs it: the deployment is known, the watches have caught up."""
    reconciler.deployment_event("ADDED", *key)
    await kube.deliver(reconciler)
    await reconciler.reconcile(*key)
    await kube.deliver(reconciler)


def condition(kube: FakeKube, name: str, type_: str) -> dict[str, Any]:
    status = kube.objects[("LLMDeployment", NS, name)]["status"]
    found: dict[str, Any] = next(c for c in status["conditions"] if c["type"] == type_)
    return found


def mounted_model_repo(kube: FakeKube, sts: str) -> str:
    """The model-repository ConfigMap a StatefulSet's pods mount."""
    volumes = kube.objects[("StatefulSet", NS, sts)]["spec"]["template"]["spec"]["volumes"]
    return str(next(v["configMap"]["name"] for v in volumes if "configMap" in v))


def rolled_out(kube: FakeKube, sts: str, ready: int) -> None:
    """What the StatefulSet controller reports once every pod runs the current template."""
    obj = kube.objects[("StatefulSet", NS, sts)]
    kube.edit("StatefulSet", NS, sts, status={
        "observedGeneration": obj["metadata"]["generation"], "replicas": ready, "readyReplicas": ready,
        "updatedReplicas": ready, "currentRevision": "r1", "updateRevision": "r1",
    })  # fmt: skip


async def test_a_cpu_deployment_converges_then_the_operator_writes_nothing() -> None:
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(example("cpu-reference"))
    await reconcile(kube, reconciler, key)

    applied = [(kind, name) for verb, kind, name in kube.take_writes() if verb == "apply"]
    repo = mounted_model_repo(kube, "tiny-llama")
    assert ("StatefulSet", "tiny-llama") in applied and ("ConfigMap", repo) in applied
    assert condition(kube, "tiny-llama", "Reconciling")["status"] == "True"
    owner_uid = kube.objects[("LLMDeployment", *key)]["metadata"]["uid"]
    for obj in kube.objects.values():
        shared = obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == MODEL_INDEX  # the namespace's
        if obj["kind"] not in ("LLMDeployment", "PersistentVolumeClaim") and not shared:
            assert obj["metadata"]["ownerReferences"][0]["uid"] == owner_uid

    rolled_out(kube, "tiny-llama", 1)
    await reconcile(kube, reconciler, key)
    assert condition(kube, "tiny-llama", "Ready")["status"] == "True"
    assert kube.take_writes() == [("status", "LLMDeployment", "tiny-llama")]

    await reconcile(kube, reconciler, key)
    await reconcile(kube, reconciler, key)
    assert kube.take_writes() == [], "an idle deployment costs no API writes"
    secrets = [k[2] for k in kube.objects if k[0] == "Secret"]
    assert secrets == [f"tiny-llama-adminkey-{owner_uid[:8]}"], "single-pod replicas need no SSH identity"


async def test_a_restarted_operator_writes_nothing_where_nothing_changed_and_restores_what_did() -> None:
    kube, first = await operator_with_nodes()
    keys = [kube.add_deployment(example(name)) for name in ("cpu-reference", "llama31-405b-multinode")]
    for key in keys:
        await reconcile(kube, first, key)
    for name in kube.of_kind("StatefulSet"):
        rolled_out(kube, name, 1)
    for key in keys:
        await reconcile(kube, first, key)
    applied = [w for w in kube.take_writes() if w[0] == "apply"]
    assert len(applied) >= 8

    # A new process (a restart, a new leader): it knows only what the watches list.
    _, second = await operator_with_nodes(kube)
    await kube.list_to(second)
    for key in keys:
        await reconcile(kube, second, key)
    # The Secrets are created again (AlreadyExists): the operator may not read Secrets to know.
    writes = [w for w in kube.take_writes() if w[0] != "status"]
    assert writes == [
        ("create", "Secret", "tiny-llama-adminkey-uid-1"),
        ("create", "Secret", "llama31-405b-adminkey-uid-2"),
        ("create", "Secret", "llama31-405b-launch-uid-2"),
    ]

    # Edited while no operator ran: the edit is someone else's, so that object alone is applied.
    sts = kube.objects[("StatefulSet", NS, "tiny-llama")]
    kube.edit("StatefulSet", NS, "tiny-llama", spec={**sts["spec"], "replicas": 5})
    _, third = await operator_with_nodes(kube)
    await kube.list_to(third)
    for key in keys:
        await reconcile(kube, third, key)
    writes = [w for w in kube.take_writes() if w[0] not in ("status", "create")]
    assert writes == [("apply", "StatefulSet", "tiny-llama")]
    assert kube.objects[("StatefulSet", NS, "tiny-llama")]["spec"]["replicas"] == 1


async def test_a_status_watched_while_the_apply_is_in_flight_is_not_lost() -> None:
    """Pods that are Ready at once (KWOK, or a busy operator): the StatefulSet's rolled-out status
    reaches the watch before the operator has read its own apply's response."""
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(example("cpu-reference"))
    plain_apply = kube.apply

    async def apply_while_the_controller_is_quick(obj: dict[str, Any]) -> dict[str, Any]:
        response = await plain_apply(obj)
        if obj["kind"] == "StatefulSet":
            rolled_out(kube, obj["metadata"]["name"], 1)
            await kube.deliver(reconciler)
        return response  # as it was when the apply returned: no status yet

    kube.apply = apply_while_the_controller_is_quick  # type: ignore[method-assign]
    await reconcile(kube, reconciler, key)
    kube.apply = plain_apply  # type: ignore[method-assign]
    await reconciler.reconcile(*key)  # the event woke the key meanwhile: the queue runs it again
    assert condition(kube, "tiny-llama", "Ready")["status"] == "True"


async def test_a_pod_the_api_server_refuses_stalls_until_the_controller_creates_it() -> None:
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(example("cpu-reference"))
    await reconcile(kube, reconciler, key)
    sts = kube.objects[("StatefulSet", NS, "tiny-llama")]
    refusal = 'create Pod tiny-llama-0 in StatefulSet tiny-llama failed error: pods "tiny-llama-0" forbidden'
    involved = {"kind": "StatefulSet", "namespace": NS, "name": "tiny-llama", "uid": sts["metadata"]["uid"]}
    event = {"reason": "FailedCreate", "message": refusal, "involvedObject": involved}
    woken: list[tuple[str, str]] = []
    reconciler.queue.add = woken.append  # type: ignore[method-assign,assignment]
    await reconciler.create_failed("ADDED", event)
    assert woken == [key], "the Event wakes its deployment"
    await reconciler.reconcile(*key)
    stalled = condition(kube, "tiny-llama", "Stalled")
    assert (stalled["status"], stalled["reason"]) == ("True", "FailedCreate")
    assert refusal in stalled["message"]
    assert ("Warning", "FailedCreate") in [(t, r) for t, r, _ in kube.events]
    kube.take_writes()
    await reconciler.create_failed("MODIFIED", event)  # the controller's next retry, same words
    await reconciler.reconcile(*key)
    assert kube.take_writes() == [], "a refusal repeated writes nothing"

    rolled_out(kube, "tiny-llama", 1)  # the pod was created after all (the quota was raised)
    await kube.deliver(reconciler)
    await reconciler.reconcile(*key)
    assert condition(kube, "tiny-llama", "Stalled")["status"] == "False"
    assert condition(kube, "tiny-llama", "Ready")["status"] == "True"


async def test_a_pod_waiting_for_capacity_turns_degraded_only_when_its_grace_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(example("cpu-reference"))
    await reconcile(kube, reconciler, key)
    since = datetime.now(UTC) - timedelta(seconds=UNPLACED_GRACE_SECONDS - 30)
    words = "0/4 nodes are available: 4 Insufficient cpu."
    scheduled = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": words,
                 "lastTransitionTime": since.strftime("%Y-%m-%dT%H:%M:%SZ")}  # fmt: skip
    pod = {"metadata": {"name": "tiny-llama-0", "namespace": NS, "labels": {L.DEPLOYMENT: "tiny-llama"}},
           "status": {"phase": "Pending", "conditions": [scheduled]}}  # fmt: skip
    later: list[tuple[tuple[str, str], float]] = []
    reconciler.queue.add_after = lambda k, delay: later.append((k, delay))  # type: ignore[method-assign,assignment]
    await reconciler.pod_event("ADDED", pod)
    await reconciler.reconcile(*key)
    reconciling = condition(kube, "tiny-llama", "Reconciling")
    assert reconciling["status"] == "True" and words in reconciling["message"]
    assert condition(kube, "tiny-llama", "Degraded")["status"] == "False"
    ((woken, delay),) = later
    assert woken == key and 25 <= delay <= 31, "woken when the grace ends, with no event to wait for"

    due = since + timedelta(seconds=UNPLACED_GRACE_SECONDS)
    stamp = due.strftime("%Y-%m-%dT%H:%M:%SZ")
    monkeypatch.setattr("llm_operator.controller.reconciler.now", lambda: stamp)
    await reconciler.reconcile(*key)
    degraded = condition(kube, "tiny-llama", "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "PodsFailing")
    assert words in degraded["message"]


async def test_engines_are_built_by_a_job_recorded_once_then_served() -> None:
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(example("llama3-70b-fp8"))
    await reconcile(kube, reconciler, key)

    (job_name,) = kube.of_kind("Job")
    assert ("create", "Job", job_name) in kube.take_writes()
    assert "StatefulSet" not in {k[0] for k in kube.objects}, "nothing serves before the engine exists"
    assert condition(kube, "llama3-70b", "Ready")["reason"] == "BuildingEngine"

    # An edit that reaches the build's pod but not the engine (same key, same Job) while it runs:
    # a Job's template is immutable, so the build is left as it is, never re-written.
    spec = kube.objects[("LLMDeployment", *key)]["spec"]
    kube.edit(
        "LLMDeployment", NS, "llama3-70b", spec={**spec, "runtime": {"env": [{"name": "A", "value": "1"}]}}
    )
    await reconcile(kube, reconciler, key)
    assert kube.of_kind("Job").keys() == {job_name}
    assert not [w for w in kube.take_writes() if w[1] == "Job"]

    kube.edit("Job", NS, job_name, status={"conditions": [{"type": "Complete", "status": "True"}]})
    await reconcile(kube, reconciler, key)
    writes = kube.take_writes()
    assert writes[0] == ("merge", "ConfigMap", ENGINE_INDEX), "the index is written in the apply step"
    assert ("apply", "StatefulSet", "llama3-70b") in writes
    assert not [w for w in writes if w[1] == "Job"], "a finished build is not written again"
    engine = kube.objects[("LLMDeployment", *key)]["status"]["engine"]
    assert engine["ready"] is True
    assert set(kube.objects[("ConfigMap", NS, ENGINE_INDEX)]["data"]) == {engine["cacheKey"]}

    await kube.delete("Job", NS, job_name)  # its TTL ran out: the index remembers the engine
    await reconcile(kube, reconciler, key)
    assert not any(kind == "Job" for _, kind, _ in kube.take_writes()[1:]), "no second build"
    assert "Job" not in {k[0] for k in kube.objects}


async def test_a_failed_build_stalls_with_the_jobs_words_and_deploys_nothing() -> None:
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(example("llama3-70b-fp8"))
    await reconcile(kube, reconciler, key)
    (job_name,) = kube.of_kind("Job")
    failed = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "OOM killed"}
    kube.edit("Job", NS, job_name, status={"conditions": [failed]})
    await reconcile(kube, reconciler, key)
    stalled = condition(kube, "llama3-70b", "Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == "EngineBuildFailed"
    assert "BackoffLimitExceeded OOM killed" in stalled["message"]
    assert "StatefulSet" not in {k[0] for k in kube.objects}


async def test_engines_are_built_and_served_by_one_tensorrt_llm_version() -> None:
    kube, reconciler = await operator_with_nodes()
    version = reconciler.config.images.trtllm_version
    key = kube.add_deployment(example("llama3-70b-fp8"))
    await reconcile(kube, reconciler, key)
    (job,) = kube.of_kind("Job").values()
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--trtllm-version") + 1] == version, "the builder checks its own version"

    body = example("llama3-70b-fp8")
    body["metadata"]["name"] = "other-version"
    other_release = next(r.trtllm for r in releases.RELEASES if r.trtllm != version)
    body["spec"]["engine"]["build"]["tensorrtLlmVersion"] = other_release
    other = kube.add_deployment(body)
    await reconcile(kube, reconciler, other)
    stalled = condition(kube, "other-version", "Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == "TensorRtLlmVersionMismatch"
    assert "default runtime and builder images run TensorRT-LLM" in stalled["message"]
    assert not [j for j in kube.of_kind("Job") if j.startswith("other-version")], "nothing is built"

    # A version of no release in the table: the default images cannot have it.
    body["spec"]["engine"]["build"]["tensorrtLlmVersion"] = "0.19.0"
    kube.edit("LLMDeployment", *other, spec=body["spec"])
    await reconcile(kube, reconciler, other)
    stalled = condition(kube, "other-version", "Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == "TensorRtLlmVersionUnknown"
    known = ", ".join(r.trtllm for r in releases.RELEASES)
    assert "engine.build.tensorrtLlmVersion" in stalled["message"] and f"({known})" in stalled["message"]
    assert not [j for j in kube.of_kind("Job") if j.startswith("other-version")], "nothing is built"

    body["spec"]["runtime"]["image"] = "registry.example/triton-trtllm:0.19.0"
    body["spec"]["engine"]["build"]["image"] = "registry.example/engine-builder:0.19.0"
    kube.edit("LLMDeployment", *other, spec=body["spec"])
    await reconcile(kube, reconciler, other)
    (job_name,) = [j for j in kube.of_kind("Job") if j.startswith("other-version")]
    args = kube.objects[("Job", NS, job_name)]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--trtllm-version") + 1] == "0.19.0"


async def test_a_build_waits_for_its_claim_and_says_which_one() -> None:
    kube, reconciler = await operator_with_nodes()
    body = example("llama3-70b-fp8")
    body["spec"]["model"]["source"]["uri"] = "pvc://models/llama3-70b/"
    del body["spec"]["model"]["cache"]  # read in place
    key = kube.add_deployment(body)
    await reconcile(kube, reconciler, key)
    stalled = condition(kube, "llama3-70b", "Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == "VolumeClaimNotFound"
    assert 'persistentvolumeclaim "models" not found in namespace default' in stalled["message"]
    assert "pvc://models/llama3-70b/" in stalled["message"]
    assert not kube.of_kind("Job"), "no build starts without its claim"
    assert kube.events[-1][:2] == ("Warning", "VolumeClaimNotFound")

    kube.add_claim("models")
    await reconcile(kube, reconciler, key)
    assert len(kube.of_kind("Job")) == 1
    assert condition(kube, "llama3-70b", "Ready")["reason"] == "BuildingEngine"
    kube.take_writes()
    await reconcile(kube, reconciler, key)
    assert kube.take_writes() == [], "claims once seen are not looked up again"


async def test_a_build_its_cache_claim_cannot_hold_waits_and_says_both_sizes() -> None:
    kube = FakeKube()
    kube.add_claim("llm-engine-cache", storage="100Gi")
    kube.add_claim("llm-calibration")
    kube.add_claim("llm-model-cache")
    cache_examples_models(kube)
    kube, reconciler = await operator_with_nodes(kube)
    key = kube.add_deployment(example("llama3-70b-fp8"))
    await reconcile(kube, reconciler, key)
    stalled = condition(kube, "llama3-70b", "Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == "CacheTooSmall"
    # 70.6e9 parameters: FP8 checkpoint and engine at tp 4, + 10% (the checkpoint is the model cache's)
    assert (
        'persistentvolumeclaim "llm-engine-cache" (pvc://llm-engine-cache/engines) holds 100Gi'
        in stalled["message"]
    )
    assert "needs 162Gi on it" in stalled["message"] and "expand the claim" in stalled["message"]
    assert not kube.of_kind("Job"), "no build starts on a claim that cannot hold it"
    assert kube.events[-1][:2] == ("Warning", "CacheTooSmall")

    # Bound larger than asked (status.capacity is what the volume holds): the build starts.
    claim = kube.objects[("PersistentVolumeClaim", NS, "llm-engine-cache")]
    kube.edit("PersistentVolumeClaim", NS, "llm-engine-cache", status={"capacity": {"storage": "1Ti"}})
    assert claim["spec"]["resources"]["requests"]["storage"] == "100Gi"
    await reconcile(kube, reconciler, key)
    assert len(kube.of_kind("Job")) == 1
    assert condition(kube, "llama3-70b", "Stalled")["status"] == "False"


def multi_node() -> dict[str, Any]:
    body = example("llama31-405b-multinode")
    body["spec"]["engine"].pop("build")
    body["spec"]["engine"].pop("cache")
    body["spec"]["engine"]["prebuilt"] = {"uri": "pvc://llm-engine-cache/prebuilt/llama31-405b"}
    body["spec"]["replicas"] = 2
    return body


async def test_multi_node_groups_get_one_launch_identity_made_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(multi_node())
    await reconcile(kube, reconciler, key)
    await reconcile(kube, reconciler, key)

    (secret,) = (s for name, s in kube.of_kind("Secret").items() if "-launch-" in name)
    owner = kube.objects[("LLMDeployment", *key)]
    assert secret["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
    assert set(secret["stringData"]) == {"leader.crt", "leader.key", "worker.crt", "worker.key"}
    assert secret["stringData"]["leader.key"].startswith("-----BEGIN PRIVATE KEY-----")
    writes = [w for w in kube.writes if w[1] == "Secret" and "-launch-" in w[2]]
    assert writes == [("create", "Secret", secret["metadata"]["name"])]
    assert "PRIVATE KEY" not in caplog.text

    restarted = Reconciler(kube, OperatorConfig.from_env())  # an operator restart: memory is gone
    for node in build_nodes(load_pools()):
        await restarted.node_event("ADDED", node)
    kube.take_writes()
    await reconcile(kube, restarted, key)
    assert ("create", "Secret", secret["metadata"]["name"]) in kube.take_writes()
    assert kube.of_kind("Secret")[secret["metadata"]["name"]] == secret, "the key is never replaced"
    assert owner["status"]["launchSecret"] == secret["metadata"]["name"], "how a restarted operator knows it"


async def test_a_secret_under_the_operators_name_that_it_did_not_create_is_never_mounted() -> None:
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(multi_node())
    uid = kube.objects[("LLMDeployment", *key)]["metadata"]["uid"]
    name = f"llama31-405b-launch-{uid}"
    # Created first by someone who may create Secrets here and read the deployment's UID.
    foreign = {"kind": "Secret", "metadata": {"name": name, "namespace": key[0]}}
    kube.objects[("Secret", key[0], name)] = foreign
    await reconcile(kube, reconciler, key)

    status = kube.objects[("LLMDeployment", *key)]["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "LaunchSecretNotOwned")
    assert f'Secret "{name}" exists but this LLMDeployment did not create it' in status["message"]
    assert "delete that Secret" in status["message"]
    assert "launchSecret" not in status
    assert not kube.of_kind("StatefulSet") and not kube.of_kind("LeaderWorkerSet"), "no pod mounts it"

    # Still refused on the next pass, and by a restarted operator.
    await reconcile(kube, reconciler, key)
    _, restarted = await operator_with_nodes(kube)
    await kube.list_to(restarted)  # its watches list what exists (the model cache index too)
    await reconcile(kube, restarted, key)
    assert kube.objects[("LLMDeployment", *key)]["status"]["reason"] == "LaunchSecretNotOwned"
    assert not kube.of_kind("StatefulSet")

    # Deleted: the operator makes its own and the groups start.
    del kube.objects[("Secret", key[0], name)]
    await reconcile(kube, restarted, key)
    assert kube.objects[("Secret", key[0], name)]["metadata"]["ownerReferences"][0]["uid"] == uid
    assert kube.objects[("LLMDeployment", *key)]["status"]["launchSecret"] == name
    assert kube.of_kind("StatefulSet")


async def test_every_deployment_gets_its_admin_key_made_once_before_its_pods(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(example("cpu-reference"))
    await reconcile(kube, reconciler, key)
    writes = kube.take_writes()
    owner = kube.objects[("LLMDeployment", *key)]
    name = f"tiny-llama-adminkey-{owner['metadata']['uid'][:8]}"
    creates = [w for w in writes if w[0] == "create"]
    assert creates == [("create", "Secret", name)]
    assert writes.index(creates[0]) < writes.index(("apply", "StatefulSet", "tiny-llama")), "before its pods"

    secret = kube.objects[("Secret", NS, name)]
    assert secret["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
    (value,) = secret["stringData"].values()
    assert len(value) == 64 and int(value, 16) >= 0, "256 bits, hex"
    assert owner["status"]["adminKeySecret"] == name, "how a restarted operator knows it is its own"
    assert value not in caplog.text and value not in yaml.safe_dump(
        list(kube.of_kind("StatefulSet").values())
    )
    (leader,) = kube.of_kind("StatefulSet").values()
    (env,) = (
        e
        for e in leader["spec"]["template"]["spec"]["containers"][0]["env"]
        if e["name"] == "LLMOP_ADMIN_KEY"
    )
    assert env["valueFrom"]["secretKeyRef"] == {"name": name, "key": "admin-key"}

    await reconcile(kube, reconciler, key)
    assert not [w for w in kube.take_writes() if w[1] == "Secret"], "made once"
    _, restarted = await operator_with_nodes(kube)
    await reconcile(kube, restarted, key)
    assert kube.objects[("Secret", NS, name)] == secret, "never replaced"
    assert condition(kube, "tiny-llama", "Stalled")["status"] == "False"


async def test_an_admin_key_secret_the_operator_did_not_create_is_never_used() -> None:
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(example("cpu-reference"))
    uid = kube.objects[("LLMDeployment", *key)]["metadata"]["uid"]
    name = f"tiny-llama-adminkey-{uid}"
    kube.objects[("Secret", key[0], name)] = {
        "kind": "Secret",
        "metadata": {"name": name, "namespace": key[0]},
    }
    await reconcile(kube, reconciler, key)

    status = kube.objects[("LLMDeployment", *key)]["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "AdminKeySecretNotOwned")
    assert f'Secret "{name}" exists but this LLMDeployment did not create it' in status["message"]
    assert "delete that Secret" in status["message"]
    assert "adminKeySecret" not in status
    assert not kube.of_kind("StatefulSet"), "no pod is started with its key"
    assert kube.events[-1][:2] == ("Warning", "AdminKeySecretNotOwned")

    _, restarted = await operator_with_nodes(kube)
    await reconcile(kube, restarted, key)
    assert kube.objects[("LLMDeployment", *key)]["status"]["reason"] == "AdminKeySecretNotOwned"

    del kube.objects[("Secret", key[0], name)]
    await reconcile(kube, restarted, key)
    assert kube.objects[("Secret", key[0], name)]["metadata"]["ownerReferences"][0]["uid"] == uid
    assert kube.objects[("LLMDeployment", *key)]["status"]["adminKeySecret"] == name
    assert kube.of_kind("StatefulSet")


async def test_a_broken_group_is_reported_by_the_reconcile_and_no_pod_is_deleted() -> None:
    """The leader relaunches its world in place (docs/architecture.md): the reconcile names the
    member that failed and why, once, and deletes nothing; an evicted member later is a new event."""
    kube, reconciler = await operator_with_nodes()
    reconciler.group_failures = GroupFailures("2026-11-01T00:00:00Z")  # watching before the failures
    key = kube.add_deployment(multi_node())
    await reconcile(kube, reconciler, key)
    workers = sorted(
        n for n, o in kube.of_kind("StatefulSet").items() if o["metadata"]["labels"][L.ROLE] == "worker"
    )
    assert len(workers) == 2
    kube.take_writes()

    worker_pod = {
        "metadata": {
            "name": f"{workers[0]}-1", "namespace": NS, "uid": "pod-1",
            "labels": {L.DEPLOYMENT: key[1], L.POOL: "main", L.ROLE: "worker", L.GROUP_INDEX: "0",
                       L.GROUP_SIZE: "2"},
        },
        "status": {"phase": "Running", "containerStatuses": [{"restartCount": 1, "lastState": {"terminated": {
            "exitCode": 1, "reason": "Error", "message": "ORTE has lost communication with a remote daemon",
            "startedAt": "2026-11-30T00:00:00Z", "finishedAt": "2026-11-30T00:10:00Z",
        }}}]},
    }  # fmt: skip
    await reconciler.pod_event("MODIFIED", worker_pod)
    assert kube.take_writes() == [], "the watch callback records; it does not act"
    assert len(reconciler.queue) == 1

    await reconciler.reconcile(*key)
    assert not [w for w in kube.take_writes() if w[1] == "Pod"], "no pod deleted: the leader relaunches"
    # Which member failed and why, in its container's words, and what serves again as a whole.
    assert kube.events[-1] == ("Warning", "GroupRecreated", (
        f"{workers[0]}-1 failed (exited 1 (Error): ORTE has lost communication with a remote daemon): "
        f"group 0 of pool main restarts as a whole, its leader relaunching every rank "
        f"({key[1]}-0, {workers[0]}-1)"))  # fmt: skip

    reported = len(kube.events)
    await reconciler.pod_event("MODIFIED", worker_pod)  # the same failure seen again
    await reconciler.reconcile(*key)
    assert len(kube.events) == reported, "each failure is reported once"

    # A member deleted (a scale-down, a removal) ends Failed with no reason of its own: no failure.
    # An evicted one has one: a new event.
    for uid, extra in (
        ("pod-2", {}),
        ("pod-3", {"reason": "Evicted", "message": "The node was low on memory."}),
    ):
        ended = {"phase": "Failed", "containerStatuses": [{"restartCount": 0, "state": {}}], **extra}
        meta = {**cast(dict[str, Any], worker_pod["metadata"]), "uid": uid,
                "deletionTimestamp": "2026-11-30T01:00:00Z"}  # fmt: skip
        gone = {**worker_pod, "metadata": meta, "status": ended}
        await reconciler.pod_event("DELETED", gone)
        await reconciler.reconcile(*key)
        assert len(kube.events) == reported + (1 if extra else 0), (uid, kube.events[-1])
    assert kube.events[-1][2].startswith(f"{workers[0]}-1 failed (Evicted: The node was low on memory.)")


async def test_a_group_that_never_formed_is_placed_anew() -> None:
    """A leader whose workers never answered (exit 69: a worker Pending where no node fits it beside
    its leader) would wait there again if relaunched in place: the group's pods are deleted, at once,
    for the scheduler to place them anew, and no other group's."""
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(multi_node())
    await reconcile(kube, reconciler, key)
    kube.take_writes()
    words = "workers unreachable on port 2222 after 600 s: x-g0-1.x-pods.default.svc: does not resolve"
    leader = {
        "metadata": {"name": f"{key[1]}-0", "namespace": NS, "uid": "leader-1",
                     "labels": {L.DEPLOYMENT: key[1], L.POOL: "main", L.ROLE: "leader",
                                "apps.kubernetes.io/pod-index": "0", L.GROUP_SIZE: "2"}},
        "status": {"phase": "Running", "containerStatuses": [{"restartCount": 1, "lastState": {"terminated": {
            "exitCode": LAUNCHER_EXIT_WORKERS_UNREACHABLE, "reason": "Error", "message": words}}}]},
    }  # fmt: skip
    await reconciler.pod_event("MODIFIED", leader)
    await reconciler.reconcile(*key)
    deleted = [name for verb, kind, name in kube.take_writes() if verb == "delete" and kind == "Pod"]
    assert deleted == [f"{key[1]}-0", f"{key[1]}-g0-1"], deleted
    assert kube.pod_graces == dict.fromkeys(deleted, UNFORMED_GROUP_GRACE_SECONDS)
    assert (
        kube.events[-1][1] == "GroupRecreated" and "placing group 0 of pool main anew" in kube.events[-1][2]
    )


def test_a_failed_member_is_named_in_its_containers_words_or_the_pods() -> None:
    ended = {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}
    assert why_failed({"phase": "Failed", "containerStatuses": [{"restartCount": 0, "state": ended}]}) == (
        "exited 137 (OOMKilled)")  # fmt: skip
    evicted = {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."}
    assert why_failed(evicted) == "Evicted: The node was low on resource: memory."


async def test_drift_is_restored_and_an_unplaceable_edit_keeps_what_serves() -> None:
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(example("llama3-8b-h100"))
    await reconcile(kube, reconciler, key)
    sts = kube.objects[("StatefulSet", NS, "llama3-8b")]
    kube.edit("StatefulSet", NS, "llama3-8b", spec={**sts["spec"], "replicas": 7})
    kube.take_writes()
    await reconcile(kube, reconciler, key)
    assert ("apply", "StatefulSet", "llama3-8b") in kube.take_writes()
    assert kube.objects[("StatefulSet", NS, "llama3-8b")]["spec"]["replicas"] == 2

    body = kube.objects[("LLMDeployment", *key)]
    kube.edit("LLMDeployment", *key, spec={**body["spec"], "parallelism": {"tensor": 64, "pipeline": 1}})
    await reconcile(kube, reconciler, key)
    assert [w for w in kube.take_writes() if w[0] != "status"] == [], "nothing serving is touched"
    stalled = condition(kube, "llama3-8b", "Stalled")
    assert stalled["status"] == "True" and stalled["observedGeneration"] == 2
    assert kube.events and kube.events[-1][0] == "Warning"


async def test_the_queue_never_runs_a_key_twice_at_once_and_reruns_what_arrived_meanwhile() -> None:
    running: list[tuple[str, str]] = []
    overlaps = runs = 0
    release = asyncio.Event()

    async def process(key: tuple[str, str]) -> None:
        nonlocal overlaps, runs
        overlaps += key in running
        runs += 1
        running.append(key)
        await release.wait()
        running.remove(key)

    queue = WorkQueue(process)
    workers = [asyncio.create_task(queue.worker()) for _ in range(3)]
    queue.add(("ns", "a"))
    await asyncio.sleep(0.01)
    queue.add(("ns", "a"))  # arrives while "a" is being processed
    queue.add(("ns", "a"))
    await asyncio.sleep(0.01)
    assert running == [("ns", "a")] and overlaps == 0
    release.set()
    await asyncio.sleep(0.05)
    assert overlaps == 0 and running == [] and len(queue) == 0
    assert runs == 2, "two adds during a pass make one more pass, not two"
    for task in workers:
        task.cancel()
    await asyncio.gather(*workers, return_exceptions=True)


async def test_a_replica_that_lost_the_lease_stops_instead_of_retrying() -> None:
    """NotLeading is no failure to retry or report: no backoff, no Stalled status, the worker ends."""
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(example("cpu-reference"))
    reconciler.deployment_event("ADDED", *key)

    async def refused(*args: Any) -> Any:
        raise NotLeading("not the holder")

    kube.apply = kube.create = kube.annotate_deployment = refused  # type: ignore[method-assign,assignment]
    for _ in range(REPORT_AFTER_FAILURES + 1):
        with pytest.raises(NotLeading):
            await reconciler._run(key)
    assert kube.take_writes() == [] and not reconciler.queue._timers
    assert "status" not in kube.objects[("LLMDeployment", *key)]


def terminating(namespace: str) -> ApiError:
    """The API server's answer to a write into a namespace being deleted."""
    cause = StatusCause(reason="NamespaceTerminating", message=f"namespace {namespace} is being terminated")
    words = f"unable to create new content in namespace {namespace} because it is being terminated"
    return ApiError(
        status=Status(code=403, reason="Forbidden", details=StatusDetails(causes=[cause]), message=words)
    )


async def applies_refused(error: ApiError) -> tuple[FakeKube, Reconciler, tuple[str, str]]:
    """An operator with the cpu-reference deployment queued, every apply and create (its admin-key
    Secret) refused with `error`."""
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(example("cpu-reference"))
    reconciler.deployment_event("ADDED", *key)

    async def refused(obj: dict[str, Any]) -> Any:
        raise error

    kube.apply = kube.create = refused  # type: ignore[method-assign]
    return kube, reconciler, key


async def test_a_namespace_being_deleted_is_no_failure_to_retry_or_report(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube, reconciler, key = await applies_refused(terminating(NS))
    with caplog.at_level(logging.INFO):
        for _ in range(REPORT_AFTER_FAILURES + 1):
            await reconciler._run(key)
    assert not reconciler.queue._timers, "no retry"
    status = kube.objects[("LLMDeployment", *key)].get("status", {})
    assert set(status) <= {"creatingSecrets"}, "nothing reported: at most the Secret it tried to create"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


async def test_a_failure_of_a_deployment_deleted_meanwhile_is_not_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube, reconciler, key = await applies_refused(
        ApiError(status=Status(code=500, reason="InternalError", message="etcd timed out"))
    )

    async def gone(*args: Any, **kwargs: Any) -> None:
        raise ApiError(
            status=Status(code=404, reason="NotFound", message='llmdeployments "tiny-llama" not found')
        )

    kube.patch_status = gone  # type: ignore[method-assign]
    for _ in range(REPORT_AFTER_FAILURES):
        await reconciler._run(key)
    assert "Traceback" not in caplog.text and "cannot report" not in caplog.text, caplog.text
    assert key in reconciler.queue._timers, "still retried: the DELETED event is what forgets it"


async def test_a_deployment_gone_with_its_namespace_is_forgotten_without_its_deleted_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A watch of matching namespaces ends with the namespace: no DELETED event comes, and the
    operator's cached body would have it retried forever against a namespace that is gone."""
    kube, reconciler, key = await applies_refused(
        ApiError(status=Status(code=404, reason="NotFound", message=f'namespaces "{NS}" not found'))
    )
    reconciler.deployment_event("ADDED", *key, kube.objects.pop(("LLMDeployment", *key)))  # as watched
    with caplog.at_level(logging.INFO):
        await reconciler._run(key)
    assert not reconciler.queue._timers, "no retry"
    assert key not in reconciler.known and key not in reconciler.bodies
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
