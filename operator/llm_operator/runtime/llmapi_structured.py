"""The llmapi model's inputs and outputs for guided decoding, n and log probabilities, which
upstream's model does not have (docs/architecture.md, "Structured outputs, tools, log probabilities
and n: the design"): the operator's wrapper (llmapi_model.py) and the CPU runtime's llmapi model
both read and write them with this module, so the two contracts' names stay one.

Inputs: `guided_decoding_guide_type` / `guided_decoding_guide` (the engine contract's names and
types: json -> GuidedDecodingParams(json_object=True), json_schema -> json=, regex -> regex=,
ebnf_grammar -> grammar=), `sampling_param_n` (SamplingParams.n) and `sampling_param_logprobs`
(SamplingParams.logprobs, k >= 0 alternatives; absent: none are returned).
Outputs, like `text_output` one row per sequence and cumulative (every response holds all so far):
`output_ids` INT32 [n, len] and `output_log_probs` FP32 [n, len], rows padded with id -1 (log
probability 0) to the longest; with k > 0, `top_logprob_ids` INT32 and `top_logprobs` FP32
[n, len, k], each position's k likeliest, padded the same way.

Standard library and numpy only: the serving image has no llm_operator (this file ships beside
model.py, as trtllm_metrics.py does).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# Each sequence takes a batch slot: the front door's bound on OpenAI's n.
MAX_SEQUENCES = 8
MAX_LOGPROBS = 20  # OpenAI's top_logprobs bound
# guided_decoding_guide_type -> GuidedDecodingParams' field (json: json_object=True).
GUIDE_FIELDS = {"json": "json_object", "json_schema": "json", "regex": "regex", "ebnf_grammar": "grammar"}
PAD_ID = -1


@dataclass(frozen=True)
class Extras:
    n: int = 1
    logprobs: int | None = None  # None: not asked for; k: the alternatives per position
    guide_type: str = ""  # "": not guided
    guide: str = ""

    def sampling_params(self) -> dict[str, Any]:
        """SamplingParams' keyword arguments for them (guided_decoding: guided_decoding_params)."""
        params: dict[str, Any] = {"n": self.n} if self.n > 1 else {}
        if self.logprobs is not None:
            params["logprobs"] = self.logprobs
        return params

    def guided_decoding_params(self) -> dict[str, Any] | None:
        """GuidedDecodingParams' keyword arguments, or None when not guided."""
        if not self.guide_type:
            return None
        field = GUIDE_FIELDS[self.guide_type]
        return {field: True if field == "json_object" else self.guide}


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def extras(read: Callable[[str], Any]) -> Extras:
    """A request's extras; read(name) is its input's one value or None. ValueError: why refused."""
    n = read("sampling_param_n")
    n = 1 if n is None else int(n)
    if not 1 <= n <= MAX_SEQUENCES:
        raise ValueError(f"sampling_param_n must be 1..{MAX_SEQUENCES}")
    k = read("sampling_param_logprobs")
    if k is not None and not 0 <= int(k) <= MAX_LOGPROBS:
        raise ValueError(f"sampling_param_logprobs must be 0..{MAX_LOGPROBS}")
    guide_type = _text(read("guided_decoding_guide_type") or "")
    guide = _text(read("guided_decoding_guide") or "")
    if guide_type and guide_type not in GUIDE_FIELDS:
        raise ValueError(f"guided_decoding_guide_type must be one of {', '.join(GUIDE_FIELDS)}")
    if guide_type not in ("", "json") and not guide:
        raise ValueError(f"guided_decoding_guide_type {guide_type} needs guided_decoding_guide")
    return Extras(n, None if k is None else int(k), guide_type, guide)


def _position(entry: Any, token: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """One position's sampled log-probability and its k likeliest (id, log-probability). The LLM
    API gives a dict {id: Logprob(logprob, rank)} per position (TokenLogprobs), or a float."""
    if not isinstance(entry, dict):
        return float(entry), []
    values: dict[int, float] = {
        int(i): float(v.logprob if hasattr(v, "logprob") else v) for i, v in entry.items()
    }
    top = sorted(values.items(), key=lambda item: -item[1])[:k]
    return values.get(token, -math.inf), top


def outputs(sequences: Sequence[Any], extras: Extras) -> dict[str, np.ndarray[Any, Any]]:
    """The extra output tensors for the request's sequences (the LLM API's CompletionOutput:
    token_ids, logprobs), none when log-probabilities were not asked for."""
    if extras.logprobs is None:
        return {}
    k, rows = extras.logprobs, [list(s.token_ids or ()) for s in sequences]
    width = max((len(r) for r in rows), default=0)
    ids = np.full((len(rows), width), PAD_ID, dtype=np.int32)
    log_probs = np.zeros((len(rows), width), dtype=np.float32)
    top_ids = np.full((len(rows), width, k), PAD_ID, dtype=np.int32)
    top = np.zeros((len(rows), width, k), dtype=np.float32)
    for s, (sequence, row) in enumerate(zip(sequences, rows, strict=True)):
        ids[s, : len(row)] = row
        for p, (entry, token) in enumerate(zip(sequence.logprobs or (), row, strict=False)):
            log_probs[s, p], alternatives = _position(entry, token, k)
            for a, (alternative, value) in enumerate(alternatives):
                top_ids[s, p, a], top[s, p, a] = alternative, value
    tensors = {"output_ids": ids, "output_log_probs": log_probs}
    if k:
        tensors |= {"top_logprob_ids": top_ids, "top_logprobs": top}
    return tensors
