"""The images the operator runs its children with (the Helm chart sets them; controller/config.py
reads them). Serving pods and build Jobs run NVIDIA's images as published (releases.py); the
launcher image copies the launcher and the build entry point into them (render/inject.py), and the
fetch image (images/fetch.Dockerfile) moves checkpoints and engines to and from the
stores."""

from __future__ import annotations

from dataclasses import dataclass

from llm_operator import inject, releases

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
# What the multi-node image's name (operator.multiNodeRuntimeImage) may carry, filled from the row of
# the deployment's release (releases.py): one value then names the sshd image of every release.
NGC_TAG = "{ngcTag}"  # the row's NGC tag, the one the operator runs NVIDIA's image of ("25.12")
TENSORRT_LLM_VERSION = "{tensorrtLlmVersion}"  # its TensorRT-LLM version ("1.1.0")
MULTI_NODE_VARIABLE = "LLMOP_MULTI_NODE_RUNTIME_IMAGE"


def launcher_image(repository: str = DEFAULT_LAUNCHER_REPOSITORY) -> str:
    """`<repository>:<content tag of this operator's injected files>` (llm_operator/inject.py)."""
    if not repository or ":" in repository.rpartition("/")[2] or "@" in repository:
        raise ValueError(
            f"{LAUNCHER_REPOSITORY_VARIABLE} {repository!r}: a repository without tag or digest "
            "(the operator tags it with the content hash of the files it copies)"
        )
    return f"{repository}:{inject.content_tag()}"


DEFAULT_LAUNCHER_IMAGE = launcher_image()


def per_release(image: str) -> bool:
    """Whether a multi-node image's name is filled in per release (else one image for one release)."""
    return NGC_TAG in image or TENSORRT_LLM_VERSION in image


def check_multi_node_runtime(image: str, trtllm_version: str) -> None:
    """Raises ValueError, at the operator's start, for a multi-node image name the operator cannot
    fill for its own release `trtllm_version`: an unknown placeholder, or {ngcTag} of a version
    outside the release table (which names no NGC tag for it)."""
    rest = image.replace(NGC_TAG, "").replace(TENSORRT_LLM_VERSION, "")
    if "{" in rest or "}" in rest:
        raise ValueError(
            f"{MULTI_NODE_VARIABLE} {image!r}: the only placeholders are {NGC_TAG} and "
            f"{TENSORRT_LLM_VERSION} (spelled so, in braces)"
        )
    if NGC_TAG in image and releases.for_trtllm(trtllm_version) is None:
        raise ValueError(
            f"{MULTI_NODE_VARIABLE} {image!r} names {NGC_TAG}, but the operator's TensorRT-LLM "
            f"{trtllm_version} (LLMOP_TRTLLM_VERSION) is not in its release table "
            f"({releases.known_versions()}), which alone gives NGC tags: use {TENSORRT_LLM_VERSION}"
        )


@dataclass(frozen=True)
class Images:
    runtime: str
    cpu_runtime: str
    engine_builder: str  # "": the NVIDIA image of the engine's TensorRT-LLM release (releases.py)
    trtllm_version: str
    # The init container of every serving pod and build Job: copies the launcher into NVIDIA's
    # image. Named by content (launcher_image), so an operator upgrade that leaves the injected files
    # as they were changes no pod template.
    launcher: str = DEFAULT_LAUNCHER_IMAGE
    # NVIDIA's image plus OpenSSH (images/triton-trtllm-sshd.Dockerfile), which it lacks and
    # multi-node layouts need; used for them only, through `multi_node_image`. As the chart sets it:
    # a name with {ngcTag} or {tensorrtLlmVersion}, an image per release, or one image, taken to be of
    # `multi_node_release`. "": none configured (desired.py refuses a multi-node layout on the
    # default image).
    multi_node_runtime: str = ""
    # Build Jobs' checkpoint download and engine upload (aws, gsutil, hf; TensorRT-LLM's examples).
    fetch: str = DEFAULT_FETCH_IMAGE
    # The router's two containers (routing.mode inference-pool).
    picker: str = DEFAULT_PICKER_IMAGE
    envoy: str = DEFAULT_ENVOY_IMAGE
    # The router's waker at autoscaling.minReplicas 0 (render/router/waker.py): `python3 -m
    # llm_operator.waker`, so the operator's own image (the chart passes it, LLMOP_WAKER_IMAGE).
    waker: str = DEFAULT_OPERATOR_IMAGE
    # The TensorRT-LLM version of a multi_node_runtime without placeholders: the operator's own
    # (controller/config.py), which stays when a deployment runs another release (release_pin.py), so
    # desired.py refuses that image to it. "": that of these images. Not in the revision hash
    # (rollout/revision.py hashes the image pods run, multi_node_image).
    multi_node_release: str = ""

    def multi_node_image(self) -> str:
        """The image of this release's pods of a layout spanning pods: multi_node_runtime with its
        placeholders filled from the row of trtllm_version ("" when none is configured)."""
        image = self.multi_node_runtime.replace(TENSORRT_LLM_VERSION, self.trtllm_version)
        if NGC_TAG not in image:
            return image
        release = releases.for_trtllm(self.trtllm_version)
        if release is None:  # the operator's start refuses this (check_multi_node_runtime)
            raise ValueError(f"TensorRT-LLM {self.trtllm_version} has no NGC tag to fill {NGC_TAG} with")
        return image.replace(NGC_TAG, release.ngc_tag)
