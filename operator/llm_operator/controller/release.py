"""The release a deployment runs, as the reconcile keeps it: recorded on the deployment at its
first reconcile (release_pin.py says why), and reported in status.release."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from llm_operator.api.v1alpha1 import LLMDeployment
from llm_operator.controller.cluster.kube import KubeApi
from llm_operator.images import Images
from llm_operator.release_pin import release_status, to_record
from llm_operator.render.pod import serving_image


async def record(
    kube: KubeApi,
    bodies: MutableMapping[tuple[str, str], dict[str, Any]],
    body: dict[str, Any],
    ld: LLMDeployment,
    images: Images,
) -> tuple[dict[str, Any], LLMDeployment]:
    """`body` and `ld` with the operator's TensorRT-LLM version recorded, when none is yet: the
    annotation is written (metadata only), and kept in `bodies` so the watch's echo of it is no
    change."""
    annotations = to_record(ld.metadata, images)
    if annotations is None:
        return body, ld
    await kube.annotate_deployment(ld.namespace, ld.name, annotations)
    meta = body["metadata"]
    meta = {**meta, "annotations": {**(meta.get("annotations") or {}), **annotations}}
    body = {**body, "metadata": meta}
    if (ld.namespace, ld.name) in bodies:
        bodies[(ld.namespace, ld.name)] = body
    return body, ld.model_copy(update={"metadata": meta})


def status(ld: LLMDeployment, images: Images) -> dict[str, str]:
    """status.release of `ld` rendered with `images` (its release's, release_pin.deployment_images)."""
    return release_status(images, serving_image(ld.spec, images))
