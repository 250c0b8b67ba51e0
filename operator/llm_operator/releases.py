"""The Triton + TensorRT-LLM releases the operator knows: one row per NGC tag of NVIDIA's
`tritonserver:<YY.MM>-trtllm-python-py3` container, which serving pods and engine builds run as
published (the operator's own files arrive through an init container, render/pod.py).

Source of each row: NVIDIA's Triton release compatibility matrix, container trtllm-python-py3
(docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/introduction/compatibility.html),
which pairs each NGC tag with its Triton, TensorRT-LLM, Python and CUDA driver versions.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class BackendLayout(StrEnum):
    """Where the release keeps the Triton backend's model repository files upstream.

    TENSORRTLLM_BACKEND: triton-inference-server/tensorrtllm_backend, `all_models/` (TensorRT-LLM
    up to 0.20). TRITON_BACKEND: NVIDIA/TensorRT-LLM, `triton_backend/all_models/` (TensorRT-LLM
    1.0 on), which also carries `llmapi/` (the PyTorch backend through the LLM API)."""

    TENSORRTLLM_BACKEND = "tensorrtllm_backend"
    TRITON_BACKEND = "triton_backend"


@dataclass(frozen=True)
class Release:
    ngc_tag: str  # YY.MM
    triton: str
    trtllm: str
    python: str
    min_driver: str  # the CUDA driver the release's CUDA needs on a consumer GPU node
    layout: BackendLayout

    @property
    def image(self) -> str:
        return f"nvcr.io/nvidia/tritonserver:{self.ngc_tag}-trtllm-python-py3"

    @property
    def upstream(self) -> tuple[str, str, str]:
        """(repository, tag, path of all_models) holding this release's backend model files."""
        if self.layout is BackendLayout.TENSORRTLLM_BACKEND:
            return ("triton-inference-server/tensorrtllm_backend", f"v{self.trtllm}", "all_models")
        return ("NVIDIA/TensorRT-LLM", f"v{self.trtllm}", "triton_backend/all_models")

    @property
    def has_pytorch_backend(self) -> bool:
        """The llmapi model (TensorRT-LLM's PyTorch backend behind Triton) ships from 1.0 on."""
        return self.layout is BackendLayout.TRITON_BACKEND


RELEASES: tuple[Release, ...] = (
    # Triton versions: the release notes of each tag (25.07 has none and is left out; 25.06 and
    # earlier are inside the range of Triton's August 2025 security bulletin, fixed from 25.07).
    Release("25.08", "2.60.0", "0.21.0", "3.12", "575", BackendLayout.TENSORRTLLM_BACKEND),
    Release("25.10", "2.62.0", "1.0.0", "3.12", "575", BackendLayout.TRITON_BACKEND),
    Release("25.12", "2.64.0", "1.1.0", "3.12", "580", BackendLayout.TRITON_BACKEND),
)
# The newest pairing the compatibility matrix lists.
DEFAULT = RELEASES[-1]
BY_TRTLLM: dict[str, Release] = {r.trtllm: r for r in RELEASES}


def for_trtllm(version: str) -> Release | None:
    """The release whose image runs TensorRT-LLM `version`; None for a version not in the table."""
    return BY_TRTLLM.get(version)
