"""The images the operator runs its children with (the Helm chart sets them; controller/config.py
reads them). Serving pods and build Jobs run NVIDIA's images as published (releases.py); the
launcher image copies the launcher and the build entry point into them (render/inject.py), and the
fetch image (images/fetch.Dockerfile) moves checkpoints and engines to and from the
stores."""

from __future__ import annotations

from dataclasses import dataclass

from llm_operator import inject

# The chart's default operator image (its tag is the project's version, tests/unit/test_registry.py).
DEFAULT_OPERATOR_IMAGE = "ghcr.io/llm-operator/llm-operator/operator:0.1.0"
# The launcher image's repository (LLMOP_LAUNCHER_IMAGE_REPOSITORY; the chart's default is beside its
# operator image); its tag is the content hash of what it holds, never the operator's version.
DEFAULT_LAUNCHER_REPOSITORY = "ghcr.io/llm-operator/llm-operator/launcher"
LAUNCHER_REPOSITORY_VARIABLE = "LLMOP_LAUNCHER_IMAGE_REPOSITORY"
DEFAULT_FETCH_IMAGE = "ghcr.io/llm-operator/llm-operator/fetch:0.1.0"
# routing.mode inference-pool's router (render/router/objects.py): the Gateway API Inference Extension's
# endpoint picker, v1.5.0 (its last release with the EPP), and Envoy, as published.
DEFAULT_PICKER_IMAGE = "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0"
DEFAULT_ENVOY_IMAGE = "docker.io/envoyproxy/envoy:distroless-v1.40.0"


def launcher_image(repository: str = DEFAULT_LAUNCHER_REPOSITORY) -> str:
    """`<repository>:<content tag of this operator's injected files>` (llm_operator/inject.py)."""
    if not repository or ":" in repository.rpartition("/")[2] or "@" in repository:
        raise ValueError(
            f"{LAUNCHER_REPOSITORY_VARIABLE} {repository!r}: a repository without tag or digest "
            "(the operator tags it with the content hash of the files it copies)"
        )
    return f"{repository}:{inject.content_tag()}"


DEFAULT_LAUNCHER_IMAGE = launcher_image()


@dataclass(frozen=True)
class Images:
    # Every serving pod's, a layout spanning pods included: NVIDIA's image of trtllm_version (or a
    # mirror of it); cpu_runtime for backend cpu-reference.
    runtime: str
    cpu_runtime: str
    engine_builder: str  # "": the NVIDIA image of the engine's TensorRT-LLM release (releases.py)
    trtllm_version: str
    # The init container of every serving pod and build Job: copies the launcher into NVIDIA's
    # image. Named by content (launcher_image), so an operator upgrade that leaves the injected files
    # as they were changes no pod template.
    launcher: str = DEFAULT_LAUNCHER_IMAGE
    # Build Jobs' checkpoint download and engine upload (aws, gsutil, hf; TensorRT-LLM's examples).
    fetch: str = DEFAULT_FETCH_IMAGE
    # The router's two containers (routing.mode inference-pool).
    picker: str = DEFAULT_PICKER_IMAGE
    envoy: str = DEFAULT_ENVOY_IMAGE
    # The router's waker at autoscaling.minReplicas 0 (render/router/waker.py): `python3 -m
    # llm_operator.waker`, so the operator's own image (the chart passes it, LLMOP_WAKER_IMAGE).
    waker: str = DEFAULT_OPERATOR_IMAGE
