"""How much host memory and disk an engine build needs, from the model's size and the precision
(pure; the rule is also in docs/launcher-and-engines.md).

With P parameters the Hugging Face checkpoint is P x 2 bytes (the models the catalogue knows are
published in bf16/fp16). Our rule, an assumption stated as such, not a measurement:

  memory   checkpoint x 1.1 + 4 GiB per GPU of the build
           convert_checkpoint.py loads the whole checkpoint into host memory before it writes the
           rank shards, and ModelOpt's quantize.py loads it (device_map="auto") with host memory
           as the spill-over; 4 GiB per GPU covers each rank's Python, torch and CUDA context in
           the conversion and in trtllm-build's --workers.
  scratch  (converted checkpoint + engine) x 1.1
           the checkpoint itself is read where it is (the model cache or a pvc:// source);
           converted checkpoint and engine: each the weights of every rank at the precision
           (plan/memory.py: the busiest rank's weights x ranks, embeddings in 16 bits), since the
           TensorRT-LLM checkpoint and the engine both hold the weights once per rank.

Unknown architectures (no catalogue entry, no spec.model.architecture) give None: the Job then
requests nothing and no capacity is checked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.plan import catalogue
from llm_operator.plan.memory import GIB, weight_bytes
from llm_operator.plan.types import PoolPlan

CHECKPOINT_BYTES_PER_PARAM = 2
MARGIN = 1.1
MEMORY_PER_GPU = 4 * GIB


@dataclass(frozen=True)
class BuildSize:
    memory: int  # bytes of host memory the build container requests
    scratch: int  # bytes of disk the converted checkpoint and the engine take

    @property
    def memory_quantity(self) -> str:
        return gib_quantity(self.memory)

    @property
    def scratch_quantity(self) -> str:
        return gib_quantity(self.scratch)


def gib_quantity(n: int) -> str:
    """Whole GiB, rounded up: readable in the Job and in status messages."""
    return f"{math.ceil(n / GIB)}Gi"


def build_size(spec: LLMDeploymentSpec, pool: PoolPlan, gpus: int) -> BuildSize | None:
    arch = catalogue.lookup(spec.model)
    if arch is None:
        return None
    checkpoint = arch.parameter_count * CHECKPOINT_BYTES_PER_PARAM
    ranks = pool.tensor * pool.pipeline
    weights = weight_bytes(arch, spec.engine.precision, pool.tensor, pool.pipeline) * ranks
    return BuildSize(
        memory=math.ceil(checkpoint * MARGIN) + MEMORY_PER_GPU * gpus,
        scratch=math.ceil(2 * weights * MARGIN),
    )


@dataclass(frozen=True)
class ClaimNeed:
    """What a build about to start needs on a claim it writes (the pvc:// engine cache): checked
    against the claim's capacity before the Job is created (controller/observe/engines.py)."""

    claim: str
    bytes: int
    key: str  # the engine's cache key
    job: str  # the build Job's name
    uri: str  # the spec's URI that names the claim (engine.cache.uri)
