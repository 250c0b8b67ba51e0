"""A Llama-architecture decoder in torch (Decoder), and the tiny model whose weights are drawn from
a seed (TinyLM): deterministic output, no downloads, fast on one CPU core. gguf_lm serves real
models' weights through the same Decoder.

Batched like a real server: prompts are left-padded into one prefill, then every step decodes one
token per sequence against a KV cache. TinyLM's arithmetic is float64 so that a request's tokens do
not depend on which requests it happened to be batched with (float32 rounding can flip an argmax).

Tokenizer: UTF-8 bytes in. Generation is restricted to printable ASCII, so every token decodes to
one character on its own and streamed pieces are always valid text.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from llm_operator.runtime.cpu_reference import TinyConfig
from llm_operator.runtime.cpu_reference.structured.guided import Matcher

DTYPE = torch.float64
PRINTABLE_FIRST, PRINTABLE_LAST = 32, 126
ROPE_BASE = 10000.0


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(tokens: Sequence[int]) -> str:
    return bytes(tokens).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class Penalties:
    """Repetition (CTRL's: positive logits divided, negative multiplied, for every token of the
    prompt and the output), presence and frequency (OpenAI's: subtracted for each output token, once
    and per occurrence), as vLLM applies them. 1, 0, 0: none."""

    repetition: float = 1.0
    presence: float = 0.0
    frequency: float = 0.0

    def problem(self) -> str | None:
        """Why these penalties cannot be used (None: they can); TensorRT-LLM's bounds."""
        if not (math.isfinite(self.repetition) and self.repetition > 0.0):
            return "repetition_penalty must be a finite number > 0 (1: off)"
        if not (math.isfinite(self.presence) and math.isfinite(self.frequency)):
            return "presence_penalty and frequency_penalty must be finite numbers (0: off)"
        return None

    def apply(self, logits: torch.Tensor, prompt: Sequence[int], output: Counter[int]) -> torch.Tensor:
        if self.repetition != 1.0:
            seen = torch.tensor(sorted({*prompt, *output}), dtype=torch.long)
            values = logits[seen]
            logits = logits.index_put(
                (seen,), torch.where(values > 0, values / self.repetition, values * self.repetition)
            )
        if output and (self.presence or self.frequency):
            ids = torch.tensor(list(output), dtype=torch.long)
            counts = torch.tensor(list(output.values()), dtype=logits.dtype)
            logits = logits.index_put((ids,), logits[ids] - self.frequency * counts - self.presence)
        return logits


@dataclass
class Sampler:
    """TensorRT-LLM's semantics: greedy unless top_k > 1 or top_p > 0; temperature scales sampling.
    Each request draws from its own generator, so its text depends on its seed alone. Penalties
    apply before either; they need the request's prompt, and the sampler keeps count of its output."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 0.0
    seed: int = 0
    penalties: Penalties = field(default_factory=Penalties)
    prompt: tuple[int, ...] = ()
    pickable: tuple[int, int] = (PRINTABLE_FIRST, PRINTABLE_LAST)  # the ids it may pick, both ends in
    end_id: int | None = None  # the end token, which is not picked before min_tokens
    min_tokens: int = 0
    guide: Matcher | None = None  # guided decoding: the grammar's mask comes first
    generator: torch.Generator = field(init=False)
    output: Counter[int] = field(init=False, default_factory=Counter)
    exhausted: bool = field(init=False, default=False)  # the guide left nothing to pick: the end

    def __post_init__(self) -> None:
        self.generator = torch.Generator().manual_seed(self.seed)

    @staticmethod
    def problem(temperature: float, top_k: int, top_p: float) -> str | None:
        """Why these sampling inputs cannot be used (None: they can), checked per request before
        any of them decodes: a NaN temperature with top_k > 1 would make torch fail the whole
        batch ("probability tensor contains nan"). The bounds are TensorRT-LLM's."""
        if not math.isfinite(temperature) or temperature < 0.0:
            return "temperature must be a finite number >= 0"
        if top_k < 0:
            return "top_k must be >= 0 (0: off)"
        if not 0.0 <= top_p <= 1.0:  # NaN fails both comparisons
            return "top_p must be in [0, 1] (0: off)"
        return None

    def pick(self, logits: torch.Tensor) -> int:
        """The next id. When a guide leaves none of the pickable ids (its grammar is complete and
        the model has no end token, or min_tokens holds the end token back), `exhausted` is set and
        the id returned is the unguided one, only to keep the batch in lockstep."""
        logits = self.penalties.apply(logits, self.prompt, self.output)
        if self.min_tokens and self.end_id is not None and self.output.total() < self.min_tokens:
            logits = logits.index_fill(0, torch.tensor([self.end_id]), -math.inf)
        pickable = slice(self.pickable[0], self.pickable[1] + 1)
        if self.guide is not None:
            masked = logits.masked_fill(~self.guide.allowed(), -math.inf)
            if not torch.isfinite(masked[pickable]).any():
                self.exhausted = True
                return self.pickable[0] + self._pick(logits[pickable])
            logits = masked
        token = self.pickable[0] + self._pick(logits[pickable])
        self.output[token] += 1
        if self.guide is not None:
            self.guide.accept(token)
        return token

    def _pick(self, logits: torch.Tensor) -> int:
        """The index picked in `logits` (the pickable ids' logits)."""
        if self.top_k == 1 or (self.top_k <= 0 and self.top_p <= 0.0):
            return int(torch.argmax(logits))
        logits = torch.div(logits, max(self.temperature, 1e-5))
        if self.top_k > 1:
            kth = torch.topk(logits, min(self.top_k, logits.numel())).values[-1]
            logits = logits.masked_fill(logits < kth, -math.inf)
        probs = torch.softmax(logits, dim=-1)
        if 0.0 < self.top_p < 1.0:
            ordered, order = torch.sort(probs, descending=True)
            outside = torch.cumsum(ordered, dim=-1) - ordered >= self.top_p  # the nucleus ends before
            probs = probs.scatter(0, order, ordered.masked_fill(outside, 0.0))
        return int(torch.multinomial(probs, 1, generator=self.generator))


@dataclass(frozen=True)
class Layer:
    """Projections [in, out]; RMSNorm gains (None: unit, as TinyLM's)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor
    attn_norm: torch.Tensor | None = None
    ffn_norm: torch.Tensor | None = None


def _rms_norm(x: torch.Tensor, gain: torch.Tensor | None, eps: float) -> torch.Tensor:
    normed = torch.mul(x, torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    return normed if gain is None else normed * gain


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.addcmul(x * cos, torch.cat((-x[..., half:], x[..., :half]), dim=-1), sin)


def tensor_shapes(c: TinyConfig) -> dict[str, tuple[int, int]]:
    """Every weight's name (the checkpoint's tensor names, checkpoint.py) and shape, in the order a
    seed draws them. Projections are [in, out]: activations multiply them from the left."""
    shapes = {"embed": (c.vocab, c.hidden)}
    for i in range(c.layers):
        shapes |= {
            f"layers.{i}.q": (c.hidden, c.heads * c.head_dim),
            f"layers.{i}.k": (c.hidden, c.kv_heads * c.head_dim),
            f"layers.{i}.v": (c.hidden, c.kv_heads * c.head_dim),
            f"layers.{i}.o": (c.heads * c.head_dim, c.hidden),
            f"layers.{i}.gate": (c.hidden, c.ffn),
            f"layers.{i}.up": (c.hidden, c.ffn),
            f"layers.{i}.down": (c.ffn, c.hidden),
        }
    shapes["lm_head"] = (c.hidden, c.vocab)
    return shapes


def seeded_tensors(config: TinyConfig, seed: int) -> dict[str, torch.Tensor]:
    """The weights a seed draws: normal embeddings, projections scaled by 1/sqrt(fan_in) so that
    activations keep their size through the layers."""
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, (fan_in, fan_out) in tensor_shapes(config).items():
        drawn = torch.randn(fan_in, fan_out, generator=g, dtype=DTYPE)
        tensors[name] = drawn if name == "embed" else torch.div(drawn, math.sqrt(fan_in))
    return tensors


class Decoder:
    """The decoder's weights (rotary positions in Hugging Face's rotate-half order) and what the
    server needs to know about its vocabulary."""

    config: TinyConfig
    embed: torch.Tensor  # [vocab, hidden]
    layers: list[Layer]
    norm: torch.Tensor | None  # the final RMSNorm's gain
    lm_head: torch.Tensor  # [hidden, vocab]
    inv_freq: torch.Tensor
    eps: float
    dtype: torch.dtype
    pickable: tuple[int, int]  # the ids generation may pick (Sampler.pickable)
    end_id: int | None  # the token that ends an answer (None: none, every answer runs to its limit)

    def start(self, prompts: Sequence[Sequence[int]]) -> Batch:
        return Batch(self, prompts)

    def generate_ids(self, prompt: Sequence[int], max_tokens: int, sampler: Sampler) -> Iterator[int]:
        """One sequence alone, to its end token or max_tokens: the reference the batched server
        must reproduce."""
        batch = self.start([prompt])
        for i in range(max_tokens):
            token = batch.pick([sampler])[0]
            yield token
            if token == self.end_id or i + 1 == max_tokens:
                return
            batch.advance([token])


class TinyLM(Decoder):
    eps = 1e-6
    dtype = DTYPE
    pickable = (PRINTABLE_FIRST, PRINTABLE_LAST)
    end_id = None
    norm = None

    def __init__(self, config: TinyConfig, seed: int) -> None:
        """A builtin model: its weights drawn from a seed."""
        self._load(config, seeded_tensors(config, seed))

    @classmethod
    def from_tensors(cls, config: TinyConfig, tensors: Mapping[str, torch.Tensor]) -> TinyLM:
        """A checkpoint's model (checkpoint.py): ValueError names the first tensor that is missing,
        unexpected or of another shape than the config's."""
        lm = cls.__new__(cls)
        lm._load(config, tensors)
        return lm

    def _load(self, config: TinyConfig, tensors: Mapping[str, torch.Tensor]) -> None:
        self.config = c = config
        expected = tensor_shapes(c)
        for name, shape in expected.items():
            if name not in tensors:
                raise ValueError(f"tensor {name} is missing")
            if tuple(tensors[name].shape) != shape:
                raise ValueError(
                    f"tensor {name} has shape {list(tensors[name].shape)}, the config needs {list(shape)}"
                )
        for name in tensors:
            if name not in expected:
                raise ValueError(f"tensor {name} is not a weight of this model")
        # The arithmetic is float64 whatever the file's dtype (see the module's docstring).
        weight = {name: tensors[name].to(DTYPE) for name in expected}
        self.embed = weight["embed"]
        self.layers = [
            Layer(*(weight[f"layers.{i}.{part}"] for part in ("q", "k", "v", "o", "gate", "up", "down")))
            for i in range(c.layers)
        ]
        self.lm_head = weight["lm_head"]
        self.inv_freq = ROPE_BASE ** (-torch.arange(0, c.head_dim, 2, dtype=DTYPE) / c.head_dim)

    def generate(self, prompt: str, max_tokens: int, sampler: Sampler | None = None) -> Iterator[str]:
        """generate_ids on text: each token is one character."""
        return map(chr, self.generate_ids(encode(prompt), max_tokens, sampler or Sampler()))


class Batch:
    """Sequences decoded in lockstep: pick() a token for each, then advance() with them.

    `layers`: the decoder layers this process runs (all by default); a pipeline stage of a model
    split over processes runs its own range (pipeline.py), keeping the KV cache of those only."""

    def __init__(self, lm: Decoder, prompts: Sequence[Sequence[int]], layers: range | None = None) -> None:
        if not all(prompts):
            raise ValueError("every prompt needs at least one token")
        self.lm = lm
        self.layers = range(len(lm.layers)) if layers is None else layers
        width = max(len(p) for p in prompts)
        pad = torch.tensor([width - len(p) for p in prompts])
        ids = torch.tensor([[0] * (width - len(p)) + list(p) for p in prompts])
        self.lengths = torch.tensor([len(p) for p in prompts])
        self.key_valid = torch.arange(width)[None, :] >= pad[:, None]  # [B, T]: False on padding
        c = lm.config
        self.k_cache = [
            torch.zeros(len(prompts), c.kv_heads, 0, c.head_dim, dtype=lm.dtype) for _ in self.layers
        ]
        self.v_cache = [
            torch.zeros(len(prompts), c.kv_heads, 0, c.head_dim, dtype=lm.dtype) for _ in self.layers
        ]
        positions = (torch.arange(width)[None, :] - pad[:, None]).clamp(min=0)
        self.logits = self._forward(ids, positions)

    def pick(self, samplers: Sequence[Sampler]) -> list[int]:
        return [s.pick(row) for s, row in zip(samplers, self.logits, strict=True)]

    def advance(self, tokens: Sequence[int]) -> None:
        self.key_valid = torch.cat((self.key_valid, torch.ones(len(tokens), 1, dtype=torch.bool)), dim=1)
        self.logits = self._forward(torch.tensor(tokens)[:, None], self.lengths[:, None])
        self.lengths = torch.add(self.lengths, 1)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Feed [B, S] tokens at [B, S] positions; return the next-token logits [B, vocab]."""
        return self.head(self.run_layers(self.lm.embed[ids], positions))

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """The last position's hidden state [B, S, hidden] -> next-token logits [B, vocab]."""
        return torch.matmul(_rms_norm(x[:, -1], self.lm.norm, self.lm.eps), self.lm.lm_head)

    def run_layers(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """This batch's layers on hidden states x [B, S, hidden] at [B, S] positions (key_valid
        already covers them), extending their KV caches."""
        lm = self.lm
        c, (b, s, _) = lm.config, x.shape
        past = self.key_valid.shape[1] - s
        angles = positions[..., None].to(lm.dtype) * lm.inv_freq  # [B, S, head_dim / 2]
        cos = torch.cat((angles.cos(), angles.cos()), dim=-1)[:, None]
        sin = torch.cat((angles.sin(), angles.sin()), dim=-1)[:, None]
        query_at = past + torch.arange(s)
        keys_at = torch.arange(past + s)
        # Causal over valid keys; a padding query sees itself only, so no row is all -inf (NaN).
        allowed = (keys_at[None, :] <= query_at[:, None]) & self.key_valid[:, None, :]
        allowed |= keys_at[None, :] == query_at[:, None]
        for i, index in enumerate(self.layers):
            layer = lm.layers[index]
            h = _rms_norm(x, layer.attn_norm, lm.eps)
            q = _rotate((h @ layer.q).view(b, s, c.heads, c.head_dim).transpose(1, 2), cos, sin)
            k = _rotate((h @ layer.k).view(b, s, c.kv_heads, c.head_dim).transpose(1, 2), cos, sin)
            v = (h @ layer.v).view(b, s, c.kv_heads, c.head_dim).transpose(1, 2)
            self.k_cache[i] = torch.cat((self.k_cache[i], k), dim=2)
            self.v_cache[i] = torch.cat((self.v_cache[i], v), dim=2)
            group = c.heads // c.kv_heads
            keys = self.k_cache[i].repeat_interleave(group, dim=1)
            values = self.v_cache[i].repeat_interleave(group, dim=1)
            scores = (q @ keys.transpose(-1, -2)) / math.sqrt(c.head_dim)
            probs = torch.softmax(scores.masked_fill(~allowed[:, None], -math.inf), dim=-1)
            x = x + (probs @ values).transpose(1, 2).reshape(b, s, c.hidden) @ layer.o
            h = _rms_norm(x, layer.ffn_norm, lm.eps)
            x = x + (torch.nn.functional.silu(h @ layer.gate) * (h @ layer.up)) @ layer.down
        return x
