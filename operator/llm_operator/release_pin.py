"""Which release an LLMDeployment runs (pure): the one recorded on it, not the operator's default.

The operator records its configured TensorRT-LLM version (LLMOP_TRTLLM_VERSION) in the annotation
`llmoperator.io/tensorrt-llm-version` at a deployment's first reconcile. From then on the
deployment's serving image and engine keys come from that version's row of the release table
(releases.py), so an operator whose default moved rolls no existing pod and rebuilds no engine.
The operator's serving image (LLMOP_RUNTIME_IMAGE, possibly a mirror) is an image of its own
version: it serves the deployments recorded with that version, and a deployment recorded with
another runs NVIDIA's image of its row, single- and multi-node pods alike. Every other image is
the operator's, whatever the deployment's release: those the revision hash covers
(rollout/revision.py) stay the same, so nothing rolls; the builder image, unset, follows the
engine's version (desired.builder_image). spec.runtime.image and spec.engine.build.* override as
before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from llm_operator import labels as L
from llm_operator import releases
from llm_operator.api.v1alpha1 import LLMDeployment
from llm_operator.images import Images
from llm_operator.plan.types import PlanningError

ANNOTATION = L.TRTLLM_VERSION


def recorded_version(metadata: Mapping[str, Any]) -> str | None:
    """The TensorRT-LLM version recorded on a deployment; None when none is (yet)."""
    return (metadata.get("annotations") or {}).get(ANNOTATION) or None


def to_record(metadata: Mapping[str, Any], images: Images) -> dict[str, str] | None:
    """The annotation to add to a deployment that has none: the operator's version; None when one
    is recorded (whatever it says: a user's edit is kept, and refused by `deployment_images`)."""
    return None if recorded_version(metadata) else {ANNOTATION: images.trtllm_version}


def deployment_images(ld: LLMDeployment, images: Images) -> Images:
    """The operator's `images` as they apply to `ld`: those of the release recorded on it (the
    operator's own where it is the operator's version). Raises PlanningError ReleaseUnknown for a
    recorded version outside the release table, other than the operator's own."""
    version = recorded_version(ld.metadata) or images.trtllm_version
    if version == images.trtllm_version:
        return images
    release = releases.for_trtllm(version)
    if release is None:
        known = releases.known_versions()
        raise PlanningError(
            "ReleaseUnknown",
            f"annotation {ANNOTATION} records TensorRT-LLM {version!r}, which is not a release this "
            f"operator knows ({known}): set it to one of those, or remove it to move the deployment "
            f"to the operator's default, TensorRT-LLM {images.trtllm_version} (its pods roll)",
        )
    return replace(images, runtime=release.image, trtllm_version=version)  # NVIDIA's, as published


def release_status(images: Images, image: str) -> dict[str, str]:
    """status.release: the deployment's TensorRT-LLM release and the image its serving pods run."""
    return {"tensorrtLlmVersion": images.trtllm_version, "image": image}
