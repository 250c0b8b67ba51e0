"""Architectures of well-known models, so users need not spell out spec.model.architecture.

Shapes come from each model's Hugging Face config.json (num_hidden_layers, hidden_size,
num_attention_heads, num_key_value_heads, vocab_size, intermediate_size, max_position_embeddings)
and the published parameter counts. Lookup is case-insensitive and tolerant of what surrounds
the model's own name: an organisation prefix ("meta-llama/"), "Meta-", and suffixes for tuning
and pre-quantized variants ("-Instruct", "-chat-hf", "-v0.3", "-FP8", "-AWQ"), so
meta-llama/Meta-Llama-3-8B-Instruct, Llama-3-8B and meta-llama-3-8b-instruct-fp8 all resolve.

llm-operator/tiny-llama is the CPU reference runtime's deterministic model
(runtime/cpu_reference, BUILTIN_MODELS): 2 layers, hidden 64, 4 heads (head dim 16), 2 KV heads,
MLP 128, byte vocabulary 256, 512 positions, untied embedding and LM head. Parameters:
embedding 256*64 + 2 layers * (q 64*64 + k,v 2*64*32 + o 64*64 + gate,up,down 3*64*128)
+ LM head 64*256 = 106,496. Change both together. llm-operator/smollm2-135m-instruct is its packaged
SmolLM2-135M-Instruct (tied embedding and LM head).
"""

from __future__ import annotations

import re

from llm_operator.api.v1alpha1 import ModelArchitecture, ModelSpec


def _arch(
    layers: int, hidden: int, heads: int, kv_heads: int, vocab: int, params: float, ffn: int, positions: int
) -> ModelArchitecture:
    return ModelArchitecture(
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=vocab,
        parameter_count=int(params),
        intermediate_size=ffn,
        max_position_embeddings=positions,
    )


_LLAMA_31_8B = _arch(32, 4096, 32, 8, 128256, 8.03e9, 14336, 131072)
_LLAMA_31_70B = _arch(80, 8192, 64, 8, 128256, 70.6e9, 28672, 131072)

# Keyed by the normalized name (see normalize).
ARCHITECTURES: dict[str, ModelArchitecture] = {
    "llama-2-7b": _arch(32, 4096, 32, 32, 32000, 6.74e9, 11008, 4096),
    "llama-2-13b": _arch(40, 5120, 40, 40, 32000, 13.0e9, 13824, 4096),
    "llama-2-70b": _arch(80, 8192, 64, 8, 32000, 69.0e9, 28672, 4096),
    "llama-3-8b": _arch(32, 4096, 32, 8, 128256, 8.03e9, 14336, 8192),
    "llama-3-70b": _arch(80, 8192, 64, 8, 128256, 70.6e9, 28672, 8192),
    "llama-3.1-8b": _LLAMA_31_8B,
    "llama-3.1-70b": _LLAMA_31_70B,
    "llama-3.1-405b": _arch(126, 16384, 128, 8, 128256, 405.9e9, 53248, 131072),
    "llama-3.2-1b": _arch(16, 2048, 32, 8, 128256, 1.24e9, 8192, 131072),
    "llama-3.2-3b": _arch(28, 3072, 24, 8, 128256, 3.21e9, 8192, 131072),
    "llama-3.3-70b": _LLAMA_31_70B,
    "mistral-7b": _arch(32, 4096, 32, 8, 32768, 7.25e9, 14336, 32768),
    # Mixture of experts: every expert's weights are resident, so the total count plans memory.
    "mixtral-8x7b": _arch(32, 4096, 32, 8, 32000, 46.7e9, 14336, 32768),
    "qwen2.5-7b": _arch(28, 3584, 28, 4, 152064, 7.62e9, 18944, 32768),
    "qwen2.5-14b": _arch(48, 5120, 40, 8, 152064, 14.7e9, 13824, 32768),
    "qwen2.5-32b": _arch(64, 5120, 40, 8, 152064, 32.5e9, 27648, 32768),
    "qwen2.5-72b": _arch(80, 8192, 64, 8, 152064, 72.7e9, 29568, 32768),
    "tinyllama-1.1b": _arch(22, 2048, 32, 4, 32000, 1.1e9, 5632, 2048),
    "tiny-llama": _arch(2, 64, 4, 2, 256, 106_496, 128, 512),
    # Embedding 49152*576 + 30 layers * (q,o 2*576*576 + k,v 2*576*192 + MLP 3*576*1536 + 2 norms
    # 576) + final norm 576.
    "smollm2-135m": _arch(30, 576, 9, 3, 49152, 134_515_008, 1536, 8192),
}

_SUFFIX = re.compile(
    r"-(instruct|chat|hf|base|it|fp8|awq|gptq|int4|int8|w4a16|w8a8|v\d+(\.\d+)*)$", re.IGNORECASE
)


def normalize(name: str) -> str:
    key = name.strip().rstrip("/").rsplit("/", 1)[-1].lower().removeprefix("meta-")
    while (stripped := _SUFFIX.sub("", key)) != key:
        key = stripped
    return key


def by_name(name: str) -> ModelArchitecture | None:
    return ARCHITECTURES.get(normalize(name))


def lookup(model: ModelSpec) -> ModelArchitecture | None:
    """spec.model.architecture, else the catalogue's entry for the model's name, else for the last
    segment of its source URI (hf://org/NAME, builtin://NAME), else None."""
    if model.architecture is not None:
        return model.architecture
    return by_name(model.name) or by_name(model.source.uri.split("://", 1)[-1])
