"""The release a deployment runs is the one recorded on it (release_pin.py): an operator whose
default moved renders existing deployments as before, and a new or un-annotated one on the new
default. Pure parts first, then the reconciler against the in-memory API (tests/unit/fake_kube.py)."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator import releases
from llm_operator.api.v1alpha1 import LLMDeployment
from llm_operator.cli import main
from llm_operator.controller.deployment_body import kept_of_deployment, without_version
from llm_operator.controller.status.status import Observation, reduce
from llm_operator.images import Images
from llm_operator.plan.types import PlanningError
from llm_operator.release_pin import ANNOTATION, deployment_images, recorded_version, to_record
from llm_operator.rollout.revision import revision_of

from tests.unit.fake_kube import FakeKube
from tests.unit.test_reconciler import NS, condition, example, operator_with_nodes, reconcile, rolled_out

OLD, NEW = releases.BY_TRTLLM["1.1.0"], releases.BY_TRTLLM["1.2.1"]
OPERATOR = Images(runtime=OLD.image, cpu_runtime="cpu:1", engine_builder="", trtllm_version=OLD.trtllm)
MIRROR = "mirror.example"
MIRRORED = replace(OPERATOR, runtime=f"{MIRROR}/triton:25.12", engine_builder=f"{MIRROR}/build:25.12")


def deployment(annotations: dict[str, str] | None = None) -> LLMDeployment:
    body = example("llama31-8b-pytorch")
    if annotations is not None:
        body["metadata"]["annotations"] = annotations
    return LLMDeployment.model_validate(body)


def test_an_unrecorded_deployment_is_recorded_with_the_operators_version_and_renders_as_before() -> None:
    ld = deployment()
    assert recorded_version(ld.metadata) is None
    assert to_record(ld.metadata, MIRRORED) == {ANNOTATION: OLD.trtllm}
    # What the operator would have rendered before it recorded anything: nothing rolls.
    assert deployment_images(ld, MIRRORED) == MIRRORED
    recorded = deployment({ANNOTATION: OLD.trtllm})
    assert to_record(recorded.metadata, MIRRORED) is None, "written once"
    assert deployment_images(recorded, MIRRORED) == MIRRORED, "the operator's own images, mirrors kept"
    assert revision_of(recorded.spec, deployment_images(recorded, MIRRORED)) == revision_of(ld.spec, MIRRORED)


def test_a_deployment_of_another_release_runs_nvidias_image_of_its_row() -> None:
    operator = replace(MIRRORED, runtime="mirror.example/triton:26.07", trtllm_version=NEW.trtllm)
    images = deployment_images(deployment({ANNOTATION: OLD.trtllm}), operator)
    assert (images.runtime, images.trtllm_version) == (OLD.image, OLD.trtllm)
    # Every other image is the operator's: the revision hash covers them, and they did not change.
    assert replace(images, runtime="", trtllm_version="") == replace(operator, runtime="", trtllm_version="")


def test_a_recorded_version_outside_the_table_is_refused_with_the_way_out() -> None:
    with pytest.raises(PlanningError) as refused:
        deployment_images(deployment({ANNOTATION: "1.1"}), OPERATOR)
    assert refused.value.reason == "ReleaseUnknown"
    message = refused.value.message
    assert ANNOTATION in message and "'1.1'" in message
    assert ", ".join(r.trtllm for r in releases.RELEASES) in message
    assert "remove it" in message and f"default, TensorRT-LLM {OLD.trtllm}" in message
    # The operator's own version is its images' to say, in the table or not.
    custom = replace(OPERATOR, runtime="registry.example/trtllm:1.3.0", trtllm_version="1.3.0")
    assert deployment_images(deployment({ANNOTATION: "1.3.0"}), custom) == custom


def test_status_release_is_written_as_observed() -> None:
    release = {"tensorrtLlmVersion": "1.1.0", "image": OLD.image}
    status, _ = reduce(Observation(1, PlanningError("X", "y"), release=release), None, "now")
    assert status["release"] == release
    status, _ = reduce(Observation(1, PlanningError("X", "y")), {"release": {"image": "old"}}, "now")
    assert "release" not in status, "not kept from an earlier pass: only what this pass resolved"


def pod_template(kube: FakeKube, name: str) -> dict[str, Any]:
    return copy.deepcopy(kube.objects[("StatefulSet", NS, name)]["spec"]["template"])


def image_of(template: dict[str, Any]) -> str:
    return str(template["spec"]["containers"][0]["image"])


async def test_an_operator_with_a_new_default_leaves_existing_deployments_on_theirs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Images that serve every release, configured all along: part of every revision, unchanged.
    monkeypatch.setenv("LLMOP_FETCH_IMAGE", "registry.example/fetch:1")
    kube, old_operator = await operator_with_nodes()
    assert old_operator.config.images.trtllm_version == OLD.trtllm
    first = kube.add_deployment(example("llama31-8b-pytorch"))
    old_operator.deployment_event("ADDED", *first, copy.deepcopy(kube.objects[("LLMDeployment", *first)]))
    await reconcile(kube, old_operator, first)
    stored = kube.objects[("LLMDeployment", *first)]
    assert stored["metadata"]["annotations"][ANNOTATION] == OLD.trtllm
    assert "spec" in stored and kube.take_writes()[0] == ("annotate", "LLMDeployment", "llama31-8b")
    assert stored["status"]["release"] == {"tensorrtLlmVersion": OLD.trtllm, "image": OLD.image}
    # The watch's echo of the annotation is no change: it queues no second pass.
    assert without_version(old_operator.bodies[first]) == without_version(kept_of_deployment(stored))
    rolled_out(kube, "llama31-8b", 2)
    before = pod_template(kube, "llama31-8b")
    assert image_of(before) == OLD.image

    # The operator restarted with another default release (as an upgrade that moved it).
    monkeypatch.setenv("LLMOP_TRTLLM_VERSION", NEW.trtllm)
    monkeypatch.setenv("LLMOP_RUNTIME_IMAGE", NEW.image)
    kube, new_operator = await operator_with_nodes(kube)
    await kube.list_to(new_operator)
    await reconcile(kube, new_operator, first)
    assert pod_template(kube, "llama31-8b") == before, "its pods do not roll"
    assert not [w for w in kube.take_writes() if w[0] == "annotate"]
    assert kube.objects[("LLMDeployment", *first)]["status"]["release"]["tensorrtLlmVersion"] == OLD.trtllm

    body = example("llama31-8b-pytorch")
    body["metadata"]["name"] = "newer"
    second = kube.add_deployment(body)
    await reconcile(kube, new_operator, second)
    assert kube.objects[("LLMDeployment", *second)]["metadata"]["annotations"][ANNOTATION] == NEW.trtllm
    assert image_of(pod_template(kube, "newer")) == NEW.image

    # The user moves the first one to the operator's default: the annotation removed is re-recorded.
    kube.objects[("LLMDeployment", *first)]["metadata"]["annotations"].pop(ANNOTATION)
    await reconcile(kube, new_operator, first)
    assert kube.objects[("LLMDeployment", *first)]["metadata"]["annotations"][ANNOTATION] == NEW.trtllm
    assert image_of(pod_template(kube, "llama31-8b")) == NEW.image


async def test_engines_are_not_rebuilt_under_a_new_default(monkeypatch: pytest.MonkeyPatch) -> None:
    kube, old_operator = await operator_with_nodes()
    key = kube.add_deployment(example("llama3-70b-fp8"))
    await reconcile(kube, old_operator, key)
    ((job_name, job),) = kube.of_kind("Job").items()
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--trtllm-version") + 1] == OLD.trtllm
    kube.edit("Job", NS, job_name, status={"conditions": [{"type": "Complete", "status": "True"}]})
    await reconcile(kube, old_operator, key)
    engine = kube.objects[("LLMDeployment", *key)]["status"]["engine"]
    assert engine["ready"] is True

    monkeypatch.setenv("LLMOP_TRTLLM_VERSION", NEW.trtllm)
    monkeypatch.setenv("LLMOP_RUNTIME_IMAGE", NEW.image)
    kube, new_operator = await operator_with_nodes(kube)
    await kube.list_to(new_operator)
    kube.take_writes()
    await reconcile(kube, new_operator, key)
    assert not [w for w in kube.take_writes() if w[1] == "Job"], "no build"
    after = kube.objects[("LLMDeployment", *key)]["status"]["engine"]
    assert (after["cacheKey"], after["ready"]) == (engine["cacheKey"], True), "the same engine serves"


async def test_an_unknown_recorded_version_stalls_and_changes_nothing() -> None:
    kube, operator = await operator_with_nodes()
    key = kube.add_deployment(example("llama31-8b-pytorch"))
    await reconcile(kube, operator, key)
    before = pod_template(kube, "llama31-8b")
    kube.objects[("LLMDeployment", *key)]["metadata"]["annotations"][ANNOTATION] = "0.19.0"
    kube.take_writes()
    await reconcile(kube, operator, key)
    stalled = condition(kube, "llama31-8b", "Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == "ReleaseUnknown"
    assert not [w for w in kube.take_writes() if w[0] in ("apply", "annotate", "delete")], "nothing touched"
    assert pod_template(kube, "llama31-8b") == before


def test_render_renders_the_recorded_release(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = example("llama31-8b-pytorch")
    body["metadata"]["annotations"] = {ANNOTATION: NEW.trtllm}
    path = tmp_path / "ld.yaml"
    path.write_text(yaml.safe_dump(body))
    assert main(["render", "-f", str(path)]) == 0
    (sts,) = [o for o in yaml.safe_load_all(capsys.readouterr().out) if o and o["kind"] == "StatefulSet"]
    assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == NEW.image


def test_render_refuses_an_unquoted_version(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = example("llama31-8b-pytorch")
    path = tmp_path / "ld.yaml"
    path.write_text(
        yaml.safe_dump(body).replace("metadata:\n", f"metadata:\n  annotations: {{{ANNOTATION}: 1.2}}\n")
    )
    assert main(["render", "-f", str(path)]) == 1
    assert f"metadata.annotations.{ANNOTATION}: must be a string" in capsys.readouterr().err
