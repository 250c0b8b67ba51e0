"""CPU reference runtime: a tiny deterministic causal LM behind Triton's python backend.

The shapes live here, free of torch, so the operator can validate builtin:// names without it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TinyConfig:
    """A Llama-shaped decoder: RMSNorm (unit gain), rotary positions, grouped-query attention,
    SwiGLU MLP, untied embedding and LM head, byte vocabulary."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int = 256
    max_positions: int = 512

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


# builtin://NAME -> shape. Keep plan/catalogue.py's entry (memory planning) equal to this.
BUILTIN_MODELS = {"tiny-llama": TinyConfig(layers=2, hidden=64, heads=4, kv_heads=2, ffn=128)}
