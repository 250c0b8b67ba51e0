"""The Triton + TensorRT-LLM releases the operator knows: one row per TensorRT-LLM version NVIDIA
shipped in its `nvcr.io/nvidia/tritonserver:<YY.MM>-trtllm-python-py3` container, naming every NGC
tag that carries it and the one the operator runs. Serving pods and engine builds run that image
as published (the operator's own files arrive through an init container, render/pod.py).

Sources, read at the commits named:
- NGC tag -> TensorRT-LLM, Python, CUDA driver: triton-inference-server/server
  docs/introduction/compatibility.md, "Container Name: trtllm-python-py3", at e1db8a6 (table last
  edited 4b54459, after 26.07).
- NGC tag -> Triton: server build.py `DEFAULT_TRITON_VERSION_MAP` at tags v2.59.0 (25.06) to
  v2.71.0 (26.07).
- Model files in the image: triton-inference-server/tensorrtllm_backend, release branches r25.06 to
  r26.07, dockerfile/Dockerfile.triton.trt_llm_backend: `WORKDIR /app` and `COPY` of TensorRT-LLM's
  `triton_backend/all_models` to `/app/all_models` (inflight_batcher_llm/ and llmapi/), the
  TensorRT-LLM source being release/0.21 (r25.08), release/1.0 (r25.09, r25.10), release/1.1
  (r25.12 to r26.02), release/1.2.1 (r26.04 to r26.07). tensorrtllm_backend's
  own all_models/ ends at v0.19.0 (removed by c4a49e8, #756); at v0.20.0 and v0.21.0 its
  docs/llmapi.md copies the llmapi model from `tensorrt_llm/triton_backend/all_models/llmapi/`.
  From 26.03 on the image's Python packages live in a venv, /opt/venv-tritonserver, first on PATH
  (r26.03 Dockerfile), where the pods' `python3` finds them.
- The TensorRT-engine backend (trtllm-build engines behind inflight_batcher_llm): server build.py
  still builds the tensorrtllm backend at v2.71.0 (26.07). NVIDIA/TensorRT-LLM release v1.3.0rc20
  (2026-06-30) says it is the last release candidate with the TensorRT backend, and later
  commits on main remove it (taken from the project's November 2026 review, not read here).

- Data-center driver branches (`datacenter_drivers`): the "Driver Requirements" of Triton's release
  notes (docs.nvidia.com/deeplearning/triton-inference-server/release-notes/rel-YY-MM.html) read
  for 25.06, 25.08, 25.10, 25.12 and 26.02 all say a data-center GPU may run on 470.57 (R470),
  525.85 (R525), 535.86 (R535) or 545.23 (R545). That paragraph is the one of 24.03 (it still names
  CUDA 12.6, and driver 575 for CUDA 13.x, where the matrix above says 580): it does not describe
  these CUDA versions. Forward compatibility (docs.nvidia.com/deploy/cuda-compatibility, "Forward
  Compatibility"; NVIDIA's page itself was not readable here) works only from supported long-term
  and production branches; the per-branch limits ComputeCanada/software-stack-config keeps from it
  (lmod/SitePackage.lua `driver_max_compat_cuda`, d4a7c57) stop R470 at CUDA 12.6 and R525 at 12.3
  and have no R545 (a feature branch), so those entries of the notes are left out. Kept on every
  row, so that no node that may work is refused: R535 at 535.86 (the Triton notes), R550 at 550.54
  (NVIDIA's SGLang container notes 25.10 and 26.05, CUDA 13.x) and R570 at 570.26 (the CUDA 12.8
  GA driver; that table gives R570 up to CUDA 13.0 and marks R535, R550 and R570 "guess"). 25.07
  and 26.04 to 26.07 notes were not found: their rows take the same branches, and 1.2.1 (26.07,
  driver 590) adds R580 from 580.65.06 (CUDA 13.0's GA driver; a long-term branch of CUDA 13).

The image's tensorrt_llm pin (that Dockerfile's `TENSORRTLLM_VER`) agrees with the matrix for
r25.09, r25.10 (1.0.0), r25.12 to r26.02 (1.1.0) and r26.04 to r26.07 (1.2.1); r25.07 and r25.08
build the wheel from a branch (the matrix is the source for 0.20.0 and 0.21.0).

Left out: 25.11, whose TensorRT-LLM the matrix gives as "1.0.3.2510" and its Dockerfile pins to
1.2.0rc2 (model files from release/1.0), neither a release on PyPI, so no tag to fetch examples
of or to check builds against; 26.03, which the matrix gives as 1.2.0 while its image installs
tensorrt_llm==1.2.0rc8 (tensorrtllm_backend r26.03 Dockerfile `TENSORRTLLM_VER`, 9736c4d; #853:
"The previous build was pinned to release/1.2 / 1.2.0rc8"), so an engine key of either version
may not match the image's own, which the builder checks; 25.05 and older, inside the range of
Triton's August 2025 security bulletin (fixed from 25.07). The matrix read has no trtllm row
after 26.07.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NgcTag:
    tag: str  # YY.MM
    triton: str  # the Triton release of that tag


@dataclass(frozen=True)
class Release:
    trtllm: str
    tags: tuple[NgcTag, ...]  # every NGC tag whose trtllm image carries this version, oldest first
    ngc_tag: str  # the tag the operator runs: the newest (most fixes) unless its row says otherwise
    python: str
    min_driver: str  # the CUDA driver the release's CUDA needs on a consumer GPU node
    # Older long-term driver branches a data-center GPU runs it on through CUDA forward
    # compatibility, each as its branch's minimum version ("535.86": 535.86 or a later R535).
    datacenter_drivers: tuple[str, ...]
    # Triton's llmapi model (TensorRT-LLM's PyTorch backend) at /app/all_models/llmapi.
    has_pytorch_backend: bool = True
    # trtllm-build engines served by the C++ inflight_batcher_llm backend.
    has_tensorrt_engine_backend: bool = True

    def __post_init__(self) -> None:
        if self.ngc_tag not in {t.tag for t in self.tags}:
            raise ValueError(f"TensorRT-LLM {self.trtllm}: NGC tag {self.ngc_tag} is not one of its tags")

    @property
    def image(self) -> str:
        return f"nvcr.io/nvidia/tritonserver:{self.ngc_tag}-trtllm-python-py3"

    @property
    def triton(self) -> str:
        """The Triton release of the tag the operator runs."""
        return next(t.triton for t in self.tags if t.tag == self.ngc_tag)


# The data-center branches every row keeps (module docstring): R535, R550, R570.
DATACENTER_BRANCHES = ("535.86", "550.54", "570.26")

RELEASES: tuple[Release, ...] = (
    # 25.06 is inside the range of the August 2025 security bulletin; 25.07 has the fixes.
    Release(
        "0.20.0",
        (NgcTag("25.06", "2.59.0"), NgcTag("25.07", "2.59.1")),
        "25.07",
        "3.12",
        "575",
        DATACENTER_BRANCHES,
    ),
    Release("0.21.0", (NgcTag("25.08", "2.60.0"),), "25.08", "3.12", "575", DATACENTER_BRANCHES),
    Release(
        "1.0.0",
        (NgcTag("25.09", "2.61.0"), NgcTag("25.10", "2.62.0")),
        "25.10",
        "3.12",
        "575",
        DATACENTER_BRANCHES,
    ),
    # 25.12, not 26.02: the default release, and moving it rolls every serving pod (a later change
    # with an upgrade path). 26.01 and 26.02 carry the same TensorRT-LLM and TensorRT 10.13.3.9.
    Release(
        "1.1.0",
        (NgcTag("25.12", "2.64.0"), NgcTag("26.01", "2.65.0"), NgcTag("26.02", "2.66.0")),
        "25.12",
        "3.12",
        "580",
        DATACENTER_BRANCHES,
    ),
    Release(
        "1.2.1",
        (
            NgcTag("26.04", "2.68.0"),
            NgcTag("26.05", "2.69.0"),
            NgcTag("26.06", "2.70.0"),
            NgcTag("26.07", "2.71.0"),
        ),
        "26.07",
        "3.12",
        "590",
        (*DATACENTER_BRANCHES, "580.65.06"),
    ),
)
BY_TRTLLM: dict[str, Release] = {r.trtllm: r for r in RELEASES}
# The serving image and TensorRT-LLM of engine keys unless the operator is configured otherwise.
# Not yet 1.2.1: the upstream names the operator renders against (tests/upstream_names.py,
# tests/unit/upstream/) are pinned from v1.1.0's files, and those files could not be read at 1.2.1
# (tensorrtllm_backend r26.05-r26.07 pin tensorrt_llm at ca88df0a4005, a commit of which no copy
# was readable; the repository is too large to fetch). Move the pins, then this.
DEFAULT = BY_TRTLLM["1.1.0"]


def known_versions() -> str:
    """The table's TensorRT-LLM versions, as refusals list them."""
    return ", ".join(r.trtllm for r in RELEASES)


def for_trtllm(version: str) -> Release | None:
    """The release whose image runs TensorRT-LLM `version`; None for a version not in the table."""
    return BY_TRTLLM.get(version)


def last_with_tensorrt_engine() -> Release:
    """The newest release in the table that still serves trtllm-build engines."""
    return [r for r in RELEASES if r.has_tensorrt_engine_backend][-1]
