"""A packaged model's weights (gguf_files: a Llama-architecture GGUF) on tiny_lm's Decoder, float32.

llama.cpp's converter stores Q and K with each head's rotary halves interleaved (its rope pairs
adjacent elements; convert_hf_to_gguf.py's LlamaModel.permute); they are put back into Hugging
Face's rotate-half order here, so one rotary code serves every model. Quantized tensors (Q4_1,
Q8_0, ...) are dequantized once, at load, by gguf's own dequantizer.

float32, not TinyLM's float64: a real model's arithmetic costs twice as much in float64 on these
cores. As on GPUs, a sampled token can then depend on which requests share its batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from llm_operator.runtime.cpu_reference import TinyConfig
from llm_operator.runtime.cpu_reference.gguf_files import GgufError
from llm_operator.runtime.cpu_reference.tiny_lm import Decoder, Layer

DTYPE = torch.float32
PARTS = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output",
         "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"}  # fmt: skip


def _unpermute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """[out, in] rows of each head from llama.cpp's interleaved pairs back to rotate-half halves."""
    out, inp = weight.shape
    halves = weight.reshape(heads, out // heads // 2, 2, inp).transpose(1, 2)
    rows: torch.Tensor = halves.reshape(out, inp)
    return rows


class GgufLM(Decoder):
    dtype = DTYPE

    def __init__(self, path: str | Path) -> None:
        from gguf import GGUFReader
        from gguf.quants import dequantize

        reader = GGUFReader(path)
        meta: dict[str, Any] = {
            name: f.contents() for name, f in reader.fields.items() if not name.startswith("tokenizer.ggml.")
        }
        if meta.get("general.architecture") != "llama":
            raise GgufError(
                f"general.architecture is {meta.get('general.architecture')!r}: only llama is served"
            )

        def key(name: str) -> Any:
            if f"llama.{name}" not in meta:
                raise GgufError(f"{path}: llama.{name} is missing")
            return meta[f"llama.{name}"]

        tensors = {
            t.name: torch.from_numpy(np.array(dequantize(t.data, t.tensor_type), dtype=np.float32))
            for t in reader.tensors
        }
        embed = tensors["token_embd.weight"]
        self.config = c = TinyConfig(
            layers=int(key("block_count")),
            hidden=int(key("embedding_length")),
            heads=int(key("attention.head_count")),
            kv_heads=int(key("attention.head_count_kv")),
            ffn=int(key("feed_forward_length")),
            vocab=embed.shape[0],
            max_positions=int(key("context_length")),
        )
        self.eps = float(key("attention.layer_norm_rms_epsilon"))
        base = float(meta.get("llama.rope.freq_base", 10000.0))
        self.inv_freq = base ** (-torch.arange(0, c.head_dim, 2, dtype=DTYPE) / c.head_dim)

        def layer(i: int) -> Layer:
            w = {part: tensors[f"blk.{i}.{name}.weight"] for part, name in PARTS.items()}
            w["q"], w["k"] = _unpermute(w["q"], c.heads), _unpermute(w["k"], c.kv_heads)
            return Layer(
                **{part: weight.T for part, weight in w.items()},  # [in, out], as Decoder multiplies
                attn_norm=tensors[f"blk.{i}.attn_norm.weight"],
                ffn_norm=tensors[f"blk.{i}.ffn_norm.weight"],
            )

        self.embed = embed
        self.layers = [layer(i) for i in range(c.layers)]
        self.norm = tensors["output_norm.weight"]
        # Tied embeddings (SmolLM2's) have no output.weight.
        self.lm_head = tensors.get("output.weight", embed).T
        self.pickable = (0, c.vocab - 1)
        end = reader.fields.get("tokenizer.ggml.eos_token_id")
        self.end_id = None if end is None else int(end.contents())
