"""Memory model of one TensorRT-LLM rank (pure; the formulas are also in docs/placement.md).

For tp x pp ranks on GPUs of M bytes, the busiest rank needs

  weights      (P - 2VH) * b_w / (tp * pp)            transformer layers, evenly split
               + VH * 2 + VH * 2 / tp   (pp = 1)      input embedding + TP-split LM head
               + VH * 2                 (pp > 1)      first stage's embedding (the larger end)
  activations  maxNumTokens * 2 * (4H + (H + 2 * kvHeads * d + 2F) / tp)
               + maxBatchSize * beams * V * 4
  runtime      2 GiB
  KV cache     tokens * 2 * ceil(L / pp) * ceil(kvHeads / tp) * d * b_kv

with P parameters, V vocabulary, H hidden size, d head dim, F MLP size (4H when unknown), L
layers, b_w bytes per weight of the precision and b_kv per KV element. It fits when

  weights + activations + runtime + KV / f <= M

where f is the share of the memory left after the rest that TensorRT-LLM gives the KV pool
(runtime.kvCache.freeGpuMemoryPercent, else the profile's), so the KV the spec's limits need is
really allocated. The KV target is a full batch of maximum-length sequences (kv_tokens_needed);
a rank that holds less but at least one maximum-length sequence still serves, admitting fewer
sequences at once: the planner prefers full fits and warns about the others. Why each term:
- Embedding and LM head (V x H each, untied) stay in the checkpoint's 16-bit dtype under every
  quantization; the LM head is split across TP ranks, the input embedding is not, because the
  engine build does not pass --use_parallel_embedding (PARALLEL_EMBEDDING below). The
  reference's params * b / (tp * pp) is the even share; the embedding's copies come on top.
- KV heads are split across TP ranks and replicated once tp exceeds them (ceil).
- Activations are fixed at build time: full-width hidden buffers (residual, norms, attention and
  MLP outputs) plus the TP-split QKV and gate/up projections for maxNumTokens tokens, and fp32
  logits of the last token of every sequence.
- Runtime: CUDA context, cuBLAS/TensorRT workspaces, NCCL buffers, allocator slack.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llm_operator.api.v1alpha1 import KvCacheDtype, LLMDeploymentSpec, ModelArchitecture, Precision
from llm_operator.profiles import PROFILES

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30

BYTES_PER_WEIGHT: dict[Precision, float] = {
    Precision.FP16: 2.0,
    Precision.BF16: 2.0,
    Precision.FP8: 1.0,
    Precision.INT8_SQ: 1.0,  # + per-channel scales, negligible
    Precision.INT4_AWQ: 0.5 + 2 / 128,  # 4-bit weights + one fp16 scale per group of 128
    Precision.W4A8_AWQ: 0.5 + 2 / 128,
}
EMBEDDING_BYTES = 2  # embeddings and LM head keep the 16-bit --dtype
PARALLEL_EMBEDDING = False  # engine/build.py builds with the input embedding replicated per TP rank
HIDDEN_BUFFERS = 4
ACTIVATION_BYTES = 2
LOGIT_BYTES = 4
RUNTIME_OVERHEAD_BYTES = 2 * GIB


def kv_element_bytes(dtype: KvCacheDtype) -> int:
    """`auto` keeps the model's 16-bit dtype: quantizing weights does not quantize the KV cache."""
    return 1 if dtype in (KvCacheDtype.FP8, KvCacheDtype.INT8) else 2


def _embedding_params(arch: ModelArchitecture) -> int:
    """Parameters of the input embedding (the LM head has as many). A model smaller than both
    together must tie them."""
    return min(arch.vocab_size * arch.hidden_size, arch.parameter_count // 2)


def weight_bytes(arch: ModelArchitecture, precision: Precision, tp: int, pp: int) -> int:
    """Weights on the busiest rank: its share of the transformer layers, plus the input embedding
    (first stage; split by TP only with parallel embedding) and/or the LM head (last stage, split
    by TP), in 16 bits. With pp = 1 one rank holds both."""
    embedding = _embedding_params(arch) * EMBEDDING_BYTES
    body = (arch.parameter_count - 2 * _embedding_params(arch)) * BYTES_PER_WEIGHT[precision] / (tp * pp)
    first = embedding // tp if PARALLEL_EMBEDDING else embedding
    last = embedding // tp
    return int(body) + (first + last if pp == 1 else max(first, last))


def kv_bytes_per_token(arch: ModelArchitecture, tp: int, pp: int, element_bytes: int) -> int:
    """K and V of every layer this rank holds, for the KV heads it holds."""
    return 2 * math.ceil(arch.num_layers / pp) * math.ceil(arch.kv_heads / tp) * arch.head_dim * element_bytes


def kv_tokens_needed(spec: LLMDeploymentSpec) -> int:
    """A full batch of maximum-length sequences (each beam its own), unless
    runtime.kvCache.maxTokens bounds the pool lower."""
    e = spec.engine
    tokens = e.max_batch_size * e.max_beam_width * e.max_seq_len
    bound = spec.runtime.kv_cache.max_tokens
    return tokens if bound is None else min(tokens, bound)


def kv_pool_percent(spec: LLMDeploymentSpec) -> int:
    """Percent of the memory left after weights and activations that the KV pool may take."""
    explicit = spec.runtime.kv_cache.free_gpu_memory_percent
    return explicit or PROFILES[spec.runtime.profile].kv_cache_free_gpu_memory_percent


def activation_bytes(arch: ModelArchitecture, spec: LLMDeploymentSpec, tp: int) -> int:
    e = spec.engine
    hidden, head_dim = arch.hidden_size, arch.head_dim
    ffn = arch.intermediate_size or 4 * hidden
    split = hidden + 2 * arch.kv_heads * head_dim + 2 * ffn
    per_token = HIDDEN_BUFFERS * hidden + math.ceil(split / tp)
    logits = e.max_batch_size * e.max_beam_width * arch.vocab_size * LOGIT_BYTES
    return e.max_num_tokens * ACTIVATION_BYTES * per_token + logits


@dataclass(frozen=True)
class Fit:
    """Per-GPU memory of the busiest rank against one GPU's memory. Truthy when the KV target
    (the spec's full batch of maximum-length sequences) fits; `serves` when at least one
    maximum-length sequence does, i.e. the deployment works but admits fewer sequences at once."""

    weights: int
    activations: int
    overhead: int
    kv_per_token: int
    kv_tokens: int  # target: kv_tokens_needed()
    min_tokens: int  # floor: one maximum-length sequence (all its beams)
    kv_percent: int
    capacity: int

    @property
    def kv(self) -> int:
        return self.kv_tokens * self.kv_per_token

    @property
    def fixed(self) -> int:
        return self.weights + self.activations + self.overhead

    @property
    def need(self) -> int:
        """Bytes per GPU for the KV target."""
        return self.fixed + math.ceil(self.kv * 100 / self.kv_percent)

    @property
    def min_need(self) -> int:
        """Bytes per GPU for one maximum-length sequence."""
        return self.fixed + math.ceil(self.min_tokens * self.kv_per_token * 100 / self.kv_percent)

    @property
    def shortfall(self) -> int:
        """Bytes per GPU missing for the KV target (<= 0 when it fits)."""
        return self.need - self.capacity

    @property
    def pool_tokens(self) -> int:
        """Tokens the memory left for the KV pool holds (TensorRT-LLM sizes the pool from free
        memory, then caps it at runtime.kvCache.maxTokens)."""
        return max(0, self.capacity - self.fixed) * self.kv_percent // 100 // max(1, self.kv_per_token)

    @property
    def fits(self) -> bool:
        return self.shortfall <= 0

    @property
    def serves(self) -> bool:
        return self.min_need <= self.capacity

    def __bool__(self) -> bool:
        return self.fits

    def describe(self) -> str:
        terms = (
            f"{gib(self.weights)} GiB weights + {gib(self.kv)} GiB KV + "
            f"{gib(self.activations + self.overhead)} GiB runtime per GPU"
        )
        if self.fits:
            return f"{terms} fit in {gib(self.capacity)} GiB"
        if self.serves:
            return (
                f"{terms} exceed {gib(self.capacity)} GiB: the KV cache holds {self.pool_tokens:,} of the "
                f"{self.kv_tokens:,} tokens a full batch of maximum-length sequences needs"
            )
        return (
            f"{terms} (KV at most {self.kv_percent}% of what is left) need {gib(self.need)} GiB, "
            f"{gib(self.shortfall)} GiB more than {gib(self.capacity)} GiB, and not even one "
            f"maximum-length sequence fits"
        )


def gib(n: int) -> str:
    return f"{n / GIB:.1f}"


def fits(arch: ModelArchitecture, spec: LLMDeploymentSpec, tp: int, pp: int, gpu_memory_mib: int) -> Fit:
    """Whether the spec's limits fit tp x pp GPUs of gpu_memory_mib each, and by how much."""
    e = spec.engine
    tokens = kv_tokens_needed(spec)
    return Fit(
        weights=weight_bytes(arch, e.precision, tp, pp),
        activations=activation_bytes(arch, spec, tp),
        overhead=RUNTIME_OVERHEAD_BYTES,
        kv_per_token=kv_bytes_per_token(arch, tp, pp, kv_element_bytes(e.kv_cache_dtype)),
        kv_tokens=tokens,
        min_tokens=min(e.max_seq_len * e.max_beam_width, tokens),
        kv_percent=kv_pool_percent(spec),
        capacity=gpu_memory_mib * MIB,
    )
