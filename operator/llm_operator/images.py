"""The images the operator runs its children with (the Helm chart sets them; controller/config.py
reads them). Serving pods and build Jobs run NVIDIA's images as published (releases.py); the
operator's own image copies the launcher and the build entry point into them (render/inject.py),
and the fetch image (images/fetch.Dockerfile) moves checkpoints and engines to and from the
stores."""

from __future__ import annotations

from dataclasses import dataclass

# The chart sets LLMOP_OPERATOR_IMAGE to the image it runs the operator with.
DEFAULT_OPERATOR_IMAGE = "ghcr.io/llm-operator/llm-operator/operator:0.1.0"
DEFAULT_FETCH_IMAGE = "ghcr.io/llm-operator/llm-operator/fetch:0.1.0"
# routing.mode inference-pool's router (render/routing.py): the Gateway API Inference Extension's
# endpoint picker, v1.5.0 (its last release with the EPP), and Envoy, as published.
DEFAULT_PICKER_IMAGE = "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0"
DEFAULT_ENVOY_IMAGE = "docker.io/envoyproxy/envoy:distroless-v1.40.0"


@dataclass(frozen=True)
class Images:
    runtime: str
    cpu_runtime: str
    engine_builder: str  # "": the NVIDIA image of the engine's TensorRT-LLM release (releases.py)
    trtllm_version: str
    # The init container of every serving pod: copies the launcher into NVIDIA's image.
    operator: str = DEFAULT_OPERATOR_IMAGE
    # NVIDIA's image plus OpenSSH (images/triton-trtllm-sshd.Dockerfile), which it lacks and
    # multi-node layouts need; used for them only. "": none configured (desired.py refuses a
    # multi-node layout on the default image).
    multi_node_runtime: str = ""
    # Build Jobs' checkpoint download and engine upload (aws, gsutil, hf; TensorRT-LLM's examples).
    fetch: str = DEFAULT_FETCH_IMAGE
    # The router's two containers (routing.mode inference-pool).
    picker: str = DEFAULT_PICKER_IMAGE
    envoy: str = DEFAULT_ENVOY_IMAGE
