"""Architectures of well-known models, so users need not spell out spec.model.architecture."""

from __future__ import annotations

from llm_operator.api.v1alpha1 import ModelArchitecture, ModelSpec

# L, hidden, heads, kv heads, vocab, params, ffn, max positions (from the models' config.json)
_TABLE: dict[str, tuple[int, int, int, int, int, int, int, int]] = {
    "llama-2-7b": (32, 4096, 32, 32, 32000, 6_740_000_000, 11008, 4096),
    "llama-2-13b": (40, 5120, 40, 40, 32000, 13_000_000_000, 13824, 4096),
    "llama-2-70b": (80, 8192, 64, 8, 32000, 69_000_000_000, 28672, 4096),
    "meta-llama-3-8b": (32, 4096, 32, 8, 128256, 8_030_000_000, 14336, 8192),
    "meta-llama-3-70b": (80, 8192, 64, 8, 128256, 70_600_000_000, 28672, 8192),
    "llama-3.1-8b": (32, 4096, 32, 8, 128256, 8_030_000_000, 14336, 131072),
    "llama-3.1-70b": (80, 8192, 64, 8, 128256, 70_600_000_000, 28672, 131072),
    "mistral-7b": (32, 4096, 32, 8, 32000, 7_240_000_000, 14336, 32768),
    "qwen2.5-7b": (28, 3584, 28, 4, 152064, 7_620_000_000, 18944, 32768),
    "qwen2.5-72b": (80, 8192, 64, 8, 152064, 72_700_000_000, 29568, 32768),
    # The CPU reference runtime's deterministic model (operator/llm_operator/runtime/cpu_reference).
    "tiny-llama": (2, 64, 4, 2, 256, 120_000, 128, 512),
}

_SUFFIXES = ("-instruct", "-chat-hf", "-chat", "-hf")


def _key(model_name: str) -> str:
    key = model_name.lower().rsplit("/", 1)[-1]
    for suffix in _SUFFIXES:
        key = key.removesuffix(suffix)
    return key


def lookup(model: ModelSpec) -> ModelArchitecture | None:
    """The spec's architecture, else the catalogue's for that model name, else None."""
    if model.architecture is not None:
        return model.architecture
    row = _TABLE.get(_key(model.name))
    if row is None:
        return None
    layers, hidden, heads, kv, vocab, params, ffn, positions = row
    return ModelArchitecture(
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        vocab_size=vocab,
        parameter_count=params,
        intermediate_size=ffn,
        max_position_embeddings=positions,
    )
