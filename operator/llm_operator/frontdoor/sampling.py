"""The sampling a request gets for what it leaves out: OpenAI's defaults (temperature 1, top_p 1),
or the model's own from its `generation_config.json`, as vLLM applies them with its default
`--generation-config auto` (vllm-project/vllm vllm/config/model.py, stored copy 18ec6629,
`get_diff_sampling_param`: temperature, top_p, top_k, repetition_penalty from the model's
`GenerationConfig.to_diff_dict()`, each used only where the request does not set it).

The file is read from the tokenizer directory the front door already loads: TensorRT-LLM engine
builds copy it there beside the tokenizer (engine/build.py, TOKENIZER_FILES), a Hugging Face
checkpoint (the pytorch backend) has it beside its tokenizer files.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm_operator.frontdoor.tokenizer import read_json_object

__all__ = ["GENERATION_CONFIG", "OPENAI", "Defaults", "from_generation_config", "load"]

GENERATION_CONFIG = "generation_config.json"
# transformers' GenerationConfig defaults (v4.57.1): to_diff_dict drops a value equal to its
# default, so vLLM never sees a file's `"top_k": 50`, nor temperature 1 or top_p 1.
_TRANSFORMERS_DEFAULTS: dict[str, float] = {"temperature": 1.0, "top_p": 1.0, "top_k": 50,
                                            "repetition_penalty": 1.0}  # fmt: skip


@dataclass(frozen=True)
class Defaults:
    """What an omitted parameter means. temperature and top_p are always sent, top_p 1 spelt out
    as trtllm-serve does (NVIDIA/TensorRT-LLM tensorrt_llm/serve/openai_protocol.py, stored copy
    0076e939, ChatCompletionRequest.to_sampling_params: temperature 1.0 and top_p 1.0 when
    unset): TensorRT-LLM's samplers are greedy when neither top_k nor top_p is set, whatever the
    temperature (the cpu reference's Sampler keeps that rule). top_k and repetition_penalty are
    sent only where the model asks for them."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    repetition_penalty: float | None = None
    source: str = "OpenAI's defaults"  # what the front door's start line names


OPENAI = Defaults()

# What each key may be, and how a refusal says so.
_RANGES: dict[str, tuple[Callable[[float], bool], str]] = {
    "temperature": (lambda v: v >= 0.0, ">= 0"),
    "top_p": (lambda v: 0.0 <= v <= 1.0, "0 to 1"),
    "top_k": (lambda v: v >= 0.0 and float(v).is_integer(), "an integer >= 0"),
    "repetition_penalty": (lambda v: v > 0.0, "> 0"),
}


def from_generation_config(config: Mapping[str, Any], where: str) -> Defaults:
    """The defaults a generation_config.json sets; ValueError naming the key that is unusable.
    do_sample is not read: vLLM does not read it either."""
    found: dict[str, float] = {}
    for key, (ok, expected) in _RANGES.items():
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"{where}: {key} must be a number, not {json.dumps(value)}")
        if value == _TRANSFORMERS_DEFAULTS[key]:
            continue
        if not ok(value):
            raise ValueError(f"{where}: {key} is {value}; it must be {expected}")
        found[key] = float(value)
    if not found:
        return OPENAI
    return Defaults(
        temperature=found.get("temperature", 1.0),
        top_p=found.get("top_p", 1.0),
        top_k=int(found["top_k"]) if found.get("top_k") else None,  # 0: no top-k, as a request's 0
        repetition_penalty=found.get("repetition_penalty"),
        source=where,
    )


def load(directory: str | Path) -> Defaults:
    """The model's defaults, or OpenAI's where its directory has no generation_config.json;
    TokenizerError or ValueError (the file and what is wrong with it) where the file cannot be used."""
    path = Path(directory) / GENERATION_CONFIG
    if not path.is_file():
        return OPENAI
    return from_generation_config(read_json_object(path), str(path))
