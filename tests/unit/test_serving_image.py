"""Which image a serving pod runs and as whom: NVIDIA's image of the default release as published,
for a layout spanning pods too, the cpu-runtime image for cpu-reference, `runtime.image` over all
of them (render/pod.py, desired.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from llm_operator import releases
from llm_operator.api.v1alpha1 import LLMDeployment
from llm_operator.desired import desired, plan_for
from llm_operator.engine.state import BuildFact, BuildObserved
from llm_operator.images import Images
from llm_operator.render.pod import NVIDIA_UID

from tests.unit.model_cache_fixtures import cached

REPO = Path(__file__).resolve().parents[2]
IMAGES = Images(releases.DEFAULT.image, "cpu-runtime:1", "builder:1", releases.DEFAULT.trtllm, "launcher:1")


def deployment(example: str, **runtime: Any) -> LLMDeployment:
    doc = yaml.safe_load((REPO / "examples" / f"{example}.yaml").read_text())
    doc["metadata"].update(namespace="default", uid="uid-1")
    doc["spec"]["runtime"] = {k: v for k, v in {**doc["spec"].get("runtime", {}), **runtime}.items() if v}
    return LLMDeployment.model_validate(doc)


def pods(ld: LLMDeployment, images: Images = IMAGES) -> list[dict[str, Any]]:
    want = desired(
        ld, plan_for(ld, None), images, lambda *_: BuildObserved(BuildFact.RECORDED), models=cached
    )
    return [o["spec"]["template"]["spec"] for o in want.children if o["kind"] == "StatefulSet"]


def test_a_single_node_pod_runs_nvidias_image_as_uid_1000() -> None:
    (pod,) = pods(deployment("llama3-8b-h100"))
    assert pod["containers"][0]["image"] == "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"
    assert pod["securityContext"]["runAsUser"] == pod["securityContext"]["runAsGroup"] == NVIDIA_UID
    assert pod["initContainers"][0]["image"] == "launcher:1"


def test_a_cpu_reference_pod_runs_the_cpu_runtime_image_as_its_own_user() -> None:
    (pod,) = pods(deployment("cpu-reference"))
    assert pod["containers"][0]["image"] == "cpu-runtime:1"
    assert "runAsUser" not in pod["securityContext"], "the image's USER 65532"


def test_a_layout_spanning_pods_runs_nvidias_image_as_published() -> None:
    """No image of its own: its ranks start through the operator's launch agent, which the launcher
    image copies in as it does for one pod (docs/launcher-and-engines.md)."""
    ld = deployment("llama31-405b-multinode", image=None)
    assert ld.spec.runtime.image is None
    multi = pods(ld)
    assert len(multi) == 2, "a leader and a worker"
    for pod in multi:
        assert pod["containers"][0]["image"] == "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"
        assert pod["securityContext"]["runAsUser"] == NVIDIA_UID
        assert pod["initContainers"][0]["image"] == "launcher:1"


def test_runtime_image_overrides_every_default() -> None:
    for example in ("llama3-8b-h100", "llama31-405b-multinode", "cpu-reference"):
        ld = deployment(example, image="mine:1")
        assert {p["containers"][0]["image"] for p in pods(ld)} == {"mine:1"}, example
