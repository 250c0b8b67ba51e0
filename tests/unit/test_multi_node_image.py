"""The multi-node image (NVIDIA's image plus sshd) runs the TensorRT-LLM of each deployment's
release: operator.multiNodeRuntimeImage names it per release with {ngcTag} / {tensorrtLlmVersion}
(images.py), and one image without them is the operator's release's, refused to a multi-node
deployment pinned to another (release_pin.check_multi_node_image). Deployments on the operator's
release render as before."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
from llm_operator import releases
from llm_operator.api.v1alpha1 import LLMDeployment
from llm_operator.controller.config import OperatorConfig
from llm_operator.desired import desired, plan_for
from llm_operator.engine.state import BuildFact, BuildObserved
from llm_operator.images import Images
from llm_operator.plan.types import PlanningError
from llm_operator.release_pin import ANNOTATION, deployment_images
from llm_operator.rollout.revision import revision_of

from tests.unit.model_cache_fixtures import cached
from tests.unit.test_reconciler import NS, condition, example, operator_with_nodes, reconcile
from tests.unit.test_revision import spec

DEFAULT, NEW = releases.DEFAULT, releases.BY_TRTLLM["1.2.1"]
SSHD = "registry.example/triton-trtllm-sshd"
PLAIN = f"{SSHD}:{DEFAULT.ngc_tag}"  # one image, as the chart took it before: of the default release
PER_TAG = f"{SSHD}:{{ngcTag}}"
MULTI_NODE = "llama31-405b-pytorch-multinode"


def operator(monkeypatch: pytest.MonkeyPatch, multi_node: str) -> Images:
    """The operator's images as it reads them at start (the chart's values), on the default release."""
    monkeypatch.delenv("LLMOP_TRTLLM_VERSION", raising=False)
    monkeypatch.setenv("LLMOP_MULTI_NODE_RUNTIME_IMAGE", multi_node)
    return OperatorConfig.from_env().images


def deployment(name: str = MULTI_NODE, version: str | None = None, image: str | None = None) -> LLMDeployment:
    body = example(name)
    body["metadata"].update(namespace=NS, uid="uid-1")
    if version is not None:
        body["metadata"]["annotations"] = {ANNOTATION: version}
    body["spec"]["runtime"].pop("image", None)  # the examples name an sshd image of 25.12
    if image is not None:
        body["spec"]["runtime"]["image"] = image
    return LLMDeployment.model_validate(body)


def render(ld: LLMDeployment, operator_images: Images) -> list[dict[str, Any]]:
    images = deployment_images(ld, operator_images)
    out = desired(ld, plan_for(ld, None, images), images, lambda *_: BuildObserved(BuildFact.RECORDED),
                  models=cached)  # fmt: skip
    return out.children


def serving_images(children: list[dict[str, Any]]) -> set[str]:
    return {
        o["spec"]["template"]["spec"]["containers"][0]["image"]
        for o in children
        if o["kind"] == "StatefulSet"
    }


@pytest.mark.parametrize("release", releases.RELEASES, ids=[r.trtllm for r in releases.RELEASES])
def test_a_name_with_placeholders_gives_each_release_its_own_sshd_image(
    release: releases.Release, monkeypatch: pytest.MonkeyPatch
) -> None:
    images = operator(monkeypatch, PER_TAG)
    children = render(deployment(version=release.trtllm), images)
    assert serving_images(children) == {f"{SSHD}:{release.ngc_tag}"}, "leaders and workers"
    by_version = operator(monkeypatch, f"{SSHD}:trtllm-{{tensorrtLlmVersion}}")
    assert serving_images(render(deployment(version=release.trtllm), by_version)) == {
        f"{SSHD}:trtllm-{release.trtllm}"
    }


def test_one_image_is_refused_to_a_multi_node_deployment_of_another_release(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    images = operator(monkeypatch, PLAIN)
    with pytest.raises(PlanningError) as refused:
        render(deployment(version=NEW.trtllm), images)
    assert refused.value.reason == "MultiNodeImageReleaseMismatch"
    message = refused.value.message
    assert f"runs TensorRT-LLM {NEW.trtllm}" in message and f"(TensorRT-LLM {DEFAULT.trtllm})" in message
    assert f"operator.multiNodeRuntimeImage, {PLAIN}," in message and "{ngcTag}" in message
    assert f"build its image of NGC tag {NEW.ngc_tag}" in message and "runtime.image" in message
    # The operator's own release keeps the image; other releases serve without it where no layout
    # spans pods, and runtime.image stays the user's to choose.
    assert serving_images(render(deployment(version=DEFAULT.trtllm), images)) == {PLAIN}
    assert serving_images(render(deployment("llama31-8b-pytorch", NEW.trtllm), images)) == {NEW.image}
    mine = f"{SSHD}:mine"
    assert serving_images(render(deployment(version=NEW.trtllm, image=mine), images)) == {mine}


def test_the_default_release_renders_as_before_whichever_way_the_image_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Upgrade safety: the revision (pod label and rollout key) of a deployment with the chart's
    one image is the one the operator computed before names could carry placeholders, and naming
    the same image per release changes no byte of what it renders."""
    before = Images(
        DEFAULT.image, "cpu:1", "", DEFAULT.trtllm, multi_node_runtime=PLAIN, launcher="launcher:1"
    )
    # Computed by the operator before this change, then moved once with every revision when the
    # launcher image replaced the operator's in the hash (tests/unit/test_revision.py).
    assert revision_of(spec(), before) == "b71c6f1fa2"
    plain, per_tag = operator(monkeypatch, PLAIN), operator(monkeypatch, PER_TAG)
    assert (
        revision_of(spec(), plain)
        == revision_of(spec(), per_tag)
        == revision_of(spec(), dataclasses.replace(plain, multi_node_release=""))
    )
    for version in (None, DEFAULT.trtllm):
        assert render(deployment(version=version), plain) == render(deployment(version=version), per_tag)


@pytest.mark.parametrize(
    ("value", "version", "message"),
    [
        (
            f"{SSHD}:{{ngc_tag}}",
            DEFAULT.trtllm,
            "the only placeholders are {ngcTag} and {tensorrtLlmVersion}",
        ),
        (f"{SSHD}:{{ngcTag", DEFAULT.trtllm, "the only placeholders are"),
        (PER_TAG, "9.9.9", "TensorRT-LLM 9.9.9 (LLMOP_TRTLLM_VERSION) is not in its release table"),
    ],
    ids=["unknown-placeholder", "unclosed", "tag-of-no-row"],
)
def test_a_name_the_operator_cannot_fill_stops_it_at_start(
    value: str, version: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMOP_MULTI_NODE_RUNTIME_IMAGE", value)
    monkeypatch.setenv("LLMOP_TRTLLM_VERSION", version)
    with pytest.raises(ValueError, match="LLMOP_MULTI_NODE_RUNTIME_IMAGE") as refused:
        OperatorConfig.from_env()
    assert message in str(refused.value)
    # A version the table lacks still fills {tensorrtLlmVersion}.
    monkeypatch.setenv("LLMOP_MULTI_NODE_RUNTIME_IMAGE", f"{SSHD}:{{tensorrtLlmVersion}}")
    monkeypatch.setenv("LLMOP_TRTLLM_VERSION", "9.9.9")
    assert OperatorConfig.from_env().images.multi_node_image() == f"{SSHD}:9.9.9"


async def test_the_refusal_stalls_the_deployment_and_touches_nothing_that_serves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operator(monkeypatch, PLAIN)
    kube, reconciler = await operator_with_nodes()
    body = example(MULTI_NODE)
    body["metadata"]["annotations"] = {ANNOTATION: NEW.trtllm}
    body["spec"]["runtime"]["image"] = f"{SSHD}:{NEW.ngc_tag}"  # the user's image serves first
    key = kube.add_deployment(body)
    await reconcile(kube, reconciler, key)
    serving = {n: copy.deepcopy(o) for (kind, _, n), o in kube.objects.items() if kind == "StatefulSet"}
    assert serving and {
        s["spec"]["template"]["spec"]["containers"][0]["image"] for s in serving.values()
    } == {f"{SSHD}:{NEW.ngc_tag}"}
    del kube.objects[("LLMDeployment", *key)]["spec"]["runtime"]["image"]  # now the operator's
    kube.take_writes()
    await reconcile(kube, reconciler, key)
    stalled = condition(kube, body["metadata"]["name"], "Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == "MultiNodeImageReleaseMismatch"
    assert not [w for w in kube.take_writes() if w[0] in ("apply", "create", "delete")], "nothing touched"
    assert {n: o for (kind, _, n), o in kube.objects.items() if kind == "StatefulSet"} == serving
