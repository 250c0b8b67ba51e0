"""A layout spanning pods runs the serving image a single-node layout runs (render/pod.py
serving_image): NVIDIA's image of the deployment's release as published, `runtime.image` over it,
the cpu-runtime image for cpu-reference. Its ranks start through the operator's launch agent
(docs/launcher-and-engines.md), so it needs no image of its own, and none is refused."""

from __future__ import annotations

from typing import Any

import pytest
from llm_operator import releases
from llm_operator.api.v1alpha1 import LLMDeployment
from llm_operator.controller.config import OperatorConfig
from llm_operator.desired import desired, plan_for
from llm_operator.engine.state import BuildFact, BuildObserved
from llm_operator.images import Images
from llm_operator.release_pin import ANNOTATION, deployment_images

from tests.unit.model_cache_fixtures import cached
from tests.unit.test_reconciler import NS, condition, example, operator_with_nodes, reconcile

DEFAULT, NEW = releases.DEFAULT, releases.BY_TRTLLM["1.2.1"]
# Each multi-node example and a single-node one of its backend.
SINGLE_NODE = {
    "llama31-405b-multinode": "llama3-8b-h100",
    "llama31-405b-pytorch-multinode": "llama31-8b-pytorch",
}
MULTI_NODE = tuple(SINGLE_NODE)


@pytest.fixture
def images(monkeypatch: pytest.MonkeyPatch) -> Images:
    """The operator's images as it reads them at start (the chart's defaults), on the default release."""
    monkeypatch.delenv("LLMOP_TRTLLM_VERSION", raising=False)
    monkeypatch.delenv("LLMOP_RUNTIME_IMAGE", raising=False)
    return OperatorConfig.from_env().images


def deployment(name: str, version: str | None = None, **spec: Any) -> LLMDeployment:
    body = example(name)
    body["metadata"].update(namespace=NS, uid="uid-1")
    if version is not None:
        body["metadata"]["annotations"] = {ANNOTATION: version}
    body["spec"].update(spec)
    return LLMDeployment.model_validate(body)


def serving_images(ld: LLMDeployment, operator_images: Images, pods: int = 1) -> set[str]:
    """The images of `ld`'s serving pods, which are `pods` to a replica (leader and workers)."""
    images = deployment_images(ld, operator_images)
    plan = plan_for(ld, None, images)
    assert [p.pods_per_replica for p in plan.pools] == [pods]
    out = desired(ld, plan, images, lambda *_: BuildObserved(BuildFact.RECORDED), models=cached)
    return {
        o["spec"]["template"]["spec"]["containers"][0]["image"]
        for o in out.children
        if o["kind"] == "StatefulSet"
    }


@pytest.mark.parametrize("release", releases.RELEASES, ids=[r.trtllm for r in releases.RELEASES])
@pytest.mark.parametrize("name", MULTI_NODE)
def test_a_multi_node_layout_runs_nvidias_image_of_its_release_as_a_single_node_one_does(
    name: str, release: releases.Release, images: Images
) -> None:
    multi = serving_images(deployment(name, release.trtllm), images, pods=2)
    assert multi == serving_images(deployment(SINGLE_NODE[name], release.trtllm), images) == {release.image}
    if release == DEFAULT:  # unrecorded: the operator's own release
        assert serving_images(deployment(name), images, pods=2) == {DEFAULT.image}


@pytest.mark.parametrize("name", MULTI_NODE)
def test_runtime_image_serves_a_multi_node_layout_as_it_serves_a_single_node_one(
    name: str, images: Images
) -> None:
    mine = {"profile": "throughput", "image": "registry.example/triton:mine"}
    assert serving_images(deployment(name, NEW.trtllm, runtime=mine), images, pods=2) == {mine["image"]}
    single = deployment(SINGLE_NODE[name], NEW.trtllm, runtime=mine)
    assert serving_images(single, images) == {mine["image"]}


def test_a_cpu_reference_group_runs_the_cpu_runtime_image_as_one_pod_does(images: Images) -> None:
    group = deployment("cpu-reference", parallelism={"tensor": 1, "pipeline": 2})
    assert serving_images(group, images, pods=2) == {images.cpu_runtime}
    assert serving_images(deployment("cpu-reference"), images) == {images.cpu_runtime}


@pytest.mark.parametrize("version", [None, NEW.trtllm], ids=["operators-release", "another-release"])
async def test_a_multi_node_deployment_without_runtime_image_is_served_not_stalled(
    version: str | None, images: Images
) -> None:
    """What MultiNodeImageMissing (no image configured) and MultiNodeImageReleaseMismatch (one of
    another release) refused before: the reconciler renders the group on NVIDIA's image."""
    image = NEW.image if version else DEFAULT.image
    kube, reconciler = await operator_with_nodes()
    body = example("llama31-405b-pytorch-multinode")
    assert "image" not in body["spec"]["runtime"]
    if version is not None:
        body["metadata"]["annotations"] = {ANNOTATION: version}
    key = kube.add_deployment(body)
    await reconcile(kube, reconciler, key)
    name = body["metadata"]["name"]
    assert condition(kube, name, "Stalled")["status"] == "False"
    serving = [o for (kind, _, _), o in kube.objects.items() if kind == "StatefulSet"]
    assert len(serving) == 2, "a leader and a worker StatefulSet"
    assert {s["spec"]["template"]["spec"]["containers"][0]["image"] for s in serving} == {image}
    status = kube.objects[("LLMDeployment", NS, name)]["status"]
    assert status["release"] == {"tensorrtLlmVersion": version or DEFAULT.trtllm, "image": image}
