"""Memory model of one TensorRT-LLM rank (pure; formulas in docs/placement.md).

per-GPU need = weights / (tp*pp)
             + KV cache for the spec's limits (tokens x bytes per token on this rank)
             + activations (fixed at build time, ~linear in maxNumTokens)
             + runtime overhead (CUDA context, cuBLAS/NCCL workspaces)
and it must fit in the GPU's memory minus a safety margin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llm_operator.api.v1alpha1 import KvCacheDtype, LLMDeploymentSpec, ModelArchitecture, Precision

GIB = 1 << 30
MIB = 1 << 20

BYTES_PER_WEIGHT = {
    Precision.FP16: 2.0,
    Precision.BF16: 2.0,
    Precision.FP8: 1.0,
    Precision.INT8_SQ: 1.0,
    Precision.INT4_AWQ: 0.5625,  # 4-bit weights + group-128 fp16 scales
    Precision.W4A8_AWQ: 0.5625,
}
RUNTIME_OVERHEAD_BYTES = 2 * GIB
ACTIVATION_BYTES_PER_TOKEN_PER_HIDDEN = 2 * 12  # fp16 buffers reused across layers (~12 per token)
SAFETY_MARGIN = 0.05  # fragmentation and allocator slack


def kv_bytes_per_element(spec: LLMDeploymentSpec) -> int:
    dtype = spec.engine.kv_cache_dtype
    if dtype in (KvCacheDtype.FP8, KvCacheDtype.INT8):
        return 1
    return 2


def kv_bytes_per_token(arch: ModelArchitecture, spec: LLMDeploymentSpec, tp: int, pp: int) -> int:
    """K and V for every layer this rank holds; KV heads are replicated when tp > kv heads."""
    layers = math.ceil(arch.num_layers / pp)
    heads = math.ceil(arch.kv_heads / tp)
    return 2 * layers * heads * arch.head_dim * kv_bytes_per_element(spec)


def kv_tokens_needed(spec: LLMDeploymentSpec) -> int:
    """A full batch in flight at half the maximum sequence length, and at least one sequence of
    maximum length. Paged KV allocates blocks as sequences grow, so reserving every sequence at
    full length would reject deployments that serve well; fewer admitted requests under
    guaranteed-no-evict is the price when real sequences run longer."""
    tokens = max(spec.engine.max_batch_size * spec.engine.max_seq_len // 2, spec.engine.max_seq_len)
    if spec.runtime.kv_cache.max_tokens is not None:
        tokens = min(tokens, spec.runtime.kv_cache.max_tokens)
    return tokens


@dataclass(frozen=True)
class Fit:
    weights: int
    kv: int
    activations: int
    overhead: int
    capacity: int

    @property
    def need(self) -> int:
        return self.weights + self.kv + self.activations + self.overhead

    @property
    def fits(self) -> bool:
        return self.need <= self.capacity

    def describe(self) -> str:
        return (
            f"{self.weights / GIB:.1f} GiB weights + {self.kv / GIB:.1f} GiB KV + "
            f"{(self.activations + self.overhead) / GIB:.1f} GiB runtime per GPU "
            f"{'fit in' if self.fits else 'exceed'} {self.capacity / GIB:.1f} GiB usable"
        )


def per_gpu(arch: ModelArchitecture, spec: LLMDeploymentSpec, tp: int, pp: int, gpu_memory_mib: int) -> Fit:
    weights = int(arch.parameter_count * BYTES_PER_WEIGHT[spec.engine.precision] / (tp * pp))
    kv = kv_tokens_needed(spec) * kv_bytes_per_token(arch, spec, tp, pp)
    activations = spec.engine.max_num_tokens * arch.hidden_size * ACTIVATION_BYTES_PER_TOKEN_PER_HIDDEN // tp
    capacity = int(gpu_memory_mib * MIB * (1 - SAFETY_MARGIN))
    return Fit(weights, kv, activations, RUNTIME_OVERHEAD_BYTES, capacity)
