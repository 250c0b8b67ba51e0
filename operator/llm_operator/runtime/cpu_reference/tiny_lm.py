"""A tiny Llama-shaped decoder (RMSNorm, grouped-query attention, SiLU MLP) with weights drawn
from a seed: deterministic output, no downloads, fast on one CPU core.

Shape (also in plan/catalogue.py as llm-operator/tiny-llama): 2 layers, hidden 64, 4 attention
heads, 2 KV heads, MLP 128, byte vocabulary 256. Text in is UTF-8 bytes; tokens out are shown as
printable ASCII so streamed text is readable.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float32]

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 256, 64, 2, 4, 2, 128
HEAD_DIM = HIDDEN // HEADS


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8")) or [0]


def decode_token(token: int) -> str:
    return chr(32 + token % 95)


def _rms_norm(x: Array) -> Array:
    return np.asarray(x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6), dtype=np.float32)


class TinyLM:
    def __init__(self, seed: int, max_seq_len: int = 512) -> None:
        rng = np.random.default_rng(seed)

        def w(*shape: int) -> Array:
            return np.asarray(rng.standard_normal(shape) / np.sqrt(shape[0]), dtype=np.float32)

        self.max_seq_len = max_seq_len
        self.embed = w(VOCAB, HIDDEN) * np.sqrt(VOCAB).astype(np.float32)
        self.layers = [
            {"q": w(HIDDEN, HEADS * HEAD_DIM), "k": w(HIDDEN, KV_HEADS * HEAD_DIM),
             "v": w(HIDDEN, KV_HEADS * HEAD_DIM), "o": w(HEADS * HEAD_DIM, HIDDEN),
             "up": w(HIDDEN, FFN), "gate": w(HIDDEN, FFN), "down": w(FFN, HIDDEN)}
            for _ in range(LAYERS)
        ]  # fmt: skip
        self.lm_head = w(HIDDEN, VOCAB)

    def _attention(self, x: Array, layer: dict[str, Array]) -> Array:
        n = x.shape[0]
        q = (x @ layer["q"]).reshape(n, HEADS, HEAD_DIM)
        k = np.repeat((x @ layer["k"]).reshape(n, KV_HEADS, HEAD_DIM), HEADS // KV_HEADS, axis=1)
        v = np.repeat((x @ layer["v"]).reshape(n, KV_HEADS, HEAD_DIM), HEADS // KV_HEADS, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(HEAD_DIM)
        scores += np.triu(np.full((n, n), -1e9, dtype=np.float32), 1)  # causal mask
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        return np.asarray(
            np.einsum("hqk,khd->qhd", probs, v).reshape(n, HIDDEN) @ layer["o"], dtype=np.float32
        )

    def logits(self, tokens: list[int]) -> Array:
        x = self.embed[np.asarray(tokens[-self.max_seq_len :])]
        for layer in self.layers:
            x = x + self._attention(_rms_norm(x), layer)
            h = _rms_norm(x)
            gate = h @ layer["gate"]
            x = x + ((gate / (1 + np.exp(-gate))) * (h @ layer["up"])) @ layer["down"]
        return np.asarray(_rms_norm(x[-1]) @ self.lm_head, dtype=np.float32)

    def generate(
        self, prompt: str, max_tokens: int, temperature: float = 0.0, seed: int = 0
    ) -> Iterator[str]:
        """Greedy by default; temperature > 0 samples from a generator seeded per request."""
        rng = np.random.default_rng(seed)
        tokens = encode(prompt)
        for _ in range(max(0, max_tokens)):
            logits = self.logits(tokens)
            if temperature > 0:
                p = np.exp((logits - logits.max()) / temperature)
                token = int(rng.choice(VOCAB, p=p / p.sum()))
            else:
                token = int(np.argmax(logits))
            tokens.append(token)
            yield decode_token(token)
