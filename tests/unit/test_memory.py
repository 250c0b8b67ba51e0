"""Memory model: the reference's worked examples, each term, and invariants (hypothesis)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llm_operator.api.v1alpha1 import KvCacheDtype, LLMDeploymentSpec, Precision
from llm_operator.plan import memory
from llm_operator.plan.catalogue import ARCHITECTURES, by_name

H100_MIB = 81559


def spec(**engine: Any) -> LLMDeploymentSpec:
    runtime = engine.pop("runtime", {})
    return LLMDeploymentSpec.model_validate(
        {
            "model": {"name": "m", "source": {"uri": "pvc://models/m"}},
            "engine": {"backend": "tensorrt-engine", **engine},
            "runtime": runtime,
        }
    )


# triton-trtllm.md section 6: fp16 weights (GB) and KV per token (KiB) of the reference models.
REFERENCE = [
    ("meta-llama/Llama-2-7b-hf", 13.5, 512),
    ("meta-llama/Llama-2-13b-chat-hf", 26.0, 800),
    ("meta-llama/Llama-2-70b-chat-hf", 138, 320),
    ("meta-llama/Meta-Llama-3-8B-Instruct", 16.1, 128),
    ("meta-llama/Meta-Llama-3-70B", 141, 320),
]


@pytest.mark.parametrize(("model", "weights_gb", "kv_kib"), REFERENCE)
def test_reference_table(model: str, weights_gb: float, kv_kib: int) -> None:
    arch = by_name(model)
    assert arch is not None
    assert memory.weight_bytes(arch, Precision.FP16, 1, 1) / 1e9 == pytest.approx(weights_gb, rel=0.01)
    assert memory.kv_bytes_per_token(arch, 1, 1, 2) == kv_kib * memory.KIB


def test_worked_example_llama3_70b_fp16_tp4_on_h100() -> None:
    """35.3 GB of weights and 80 KiB of KV per token per GPU; about 450k tokens of KV on 80 GB."""
    arch = by_name("meta-llama/Meta-Llama-3-70B-Instruct")
    assert arch is not None
    even_share = arch.parameter_count * 2 / 4
    assert even_share / 1e9 == pytest.approx(35.3, abs=0.05)
    # On top: the input embedding is not split by TP (no --use_parallel_embedding), 3/4 of 2.1 GB.
    embedding_copies = arch.vocab_size * arch.hidden_size * 2 * 3 / 4
    assert embedding_copies / 1e9 == pytest.approx(1.58, abs=0.01)
    assert memory.weight_bytes(arch, Precision.FP16, 4, 1) == pytest.approx(
        even_share + embedding_copies, abs=2
    )
    assert memory.kv_bytes_per_token(arch, 4, 1, 2) == 80 * memory.KIB
    fit = memory.fits(arch, spec(maxBatchSize=32, maxSeqLen=8192), 4, 1, H100_MIB)
    assert fit and fit.kv_tokens == 32 * 8192
    assert 400_000 < fit.pool_tokens < 550_000


def test_kv_heads_replicate_beyond_tp_and_layers_split_by_pp() -> None:
    arch = ARCHITECTURES["llama-3-70b"]  # 8 KV heads, 80 layers
    per_token = {tp: memory.kv_bytes_per_token(arch, tp, 1, 2) for tp in (1, 2, 4, 8, 16, 64)}
    assert per_token[8] == per_token[16] == per_token[64] == per_token[1] // 8
    assert memory.kv_bytes_per_token(arch, 1, 4, 2) == per_token[1] // 4
    assert memory.kv_bytes_per_token(arch, 1, 1, 1) == per_token[1] // 2


def test_quantized_weights_keep_embeddings_in_16_bits_on_the_end_stages() -> None:
    arch = ARCHITECTURES["llama-3-70b"]
    table = arch.vocab_size * arch.hidden_size  # parameters of the embedding, and of the LM head
    body = arch.parameter_count - 2 * table
    assert memory.weight_bytes(arch, Precision.FP8, 1, 1) == body + 2 * table * 2
    int4 = memory.weight_bytes(arch, Precision.INT4_AWQ, 2, 1)
    assert int4 == int(body * (0.5 + 2 / 128) / 2) + table * 2 + table * 2 // 2
    # PP: the first stage holds the embedding, the last the (TP-split) LM head: the larger counts.
    assert memory.weight_bytes(arch, Precision.FP16, 2, 4) == int(body * 2 / 8) + table * 2


def test_kv_budget_is_a_full_batch_unless_bounded() -> None:
    assert memory.kv_tokens_needed(spec(maxBatchSize=8, maxSeqLen=4096, maxBeamWidth=2)) == 8 * 2 * 4096
    bounded = spec(maxBatchSize=8, maxSeqLen=4096, runtime={"kvCache": {"maxTokens": 10_000}})
    assert memory.kv_tokens_needed(bounded) == 10_000


def test_kv_pool_share_comes_from_the_spec_or_the_profile() -> None:
    assert memory.kv_pool_percent(spec(runtime={"profile": "latency"})) == 85
    assert memory.kv_pool_percent(spec(runtime={"kvCache": {"freeGpuMemoryPercent": 70}})) == 70
    assert memory.kv_element_bytes(KvCacheDtype.AUTO) == 2 and memory.kv_element_bytes(KvCacheDtype.FP8) == 1


def test_three_outcomes_fit_serve_or_nothing() -> None:
    arch = ARCHITECTURES["llama-3-8b"]
    full = memory.fits(arch, spec(precision="bf16", maxBatchSize=16, maxSeqLen=8192), 1, 1, H100_MIB)
    assert full and full.shortfall <= 0 and full.describe().endswith("fit in 79.6 GiB")
    # 64 sequences of 8192 tokens want 64 GiB of KV: one H100 serves, with fewer sequences at once.
    partial = memory.fits(arch, spec(precision="bf16", maxBatchSize=64, maxSeqLen=8192), 1, 1, H100_MIB)
    assert not partial and partial.serves and partial.shortfall > 0
    assert partial.min_tokens <= partial.pool_tokens < partial.kv_tokens
    assert f"holds {partial.pool_tokens:,} of the {partial.kv_tokens:,} tokens" in partial.describe()
    nothing = memory.fits(ARCHITECTURES["llama-3-70b"], spec(precision="fp16"), 1, 1, 23028)
    assert not nothing.serves and "not even one maximum-length sequence fits" in nothing.describe()
    assert f"{nothing.shortfall / memory.GIB:.1f} GiB more than 22.5 GiB" in nothing.describe()


POWERS = [1, 2, 4, 8, 16, 32, 64]


@settings(max_examples=80, deadline=None)
@given(
    model=st.sampled_from(sorted(ARCHITECTURES)),
    precision=st.sampled_from(list(Precision)),
    kv=st.sampled_from(["auto", "fp8"]),
    batch=st.integers(1, 512),
    seq=st.integers(1, 1 << 17),
    tp=st.sampled_from(POWERS),
    pp=st.sampled_from(POWERS),
    memory_mib=st.integers(1 << 10, 1 << 18),
)
def test_invariants(
    model: str, precision: Precision, kv: str, batch: int, seq: int, tp: int, pp: int, memory_mib: int
) -> None:
    arch = ARCHITECTURES[model]
    s = spec(precision=precision.value, kvCacheDtype=kv, maxBatchSize=batch, maxInputLen=seq, maxSeqLen=seq)
    fit = memory.fits(arch, s, tp, pp, memory_mib)
    assert bool(fit) == (fit.need <= memory_mib * memory.MIB) == (fit.shortfall <= 0)
    assert fit.min_need <= fit.need and (not fit or fit.serves)
    assert fit.pool_tokens >= (fit.kv_tokens if fit else fit.min_tokens if fit.serves else 0)
    # More GPUs never need more memory per GPU, and more memory never turns a fit into a misfit.
    for wider in (memory.fits(arch, s, tp * 2, pp, memory_mib), memory.fits(arch, s, tp, pp * 2, memory_mib)):
        assert wider.need <= fit.need
    assert not fit or memory.fits(arch, s, tp, pp, memory_mib * 2)
