"""The engine contract's inputs and outputs for log probabilities, n and guided decoding, as the
TensorRT-LLM backend names them (tests/upstream_names.py; docs/architecture.md, "Structured
outputs ... the design"), apart from Triton's python API so that they are tested without it.

- `return_log_probs`: each response adds `output_log_probs` [1, 1, len] (its new ids' when
  streaming, all the generated ids' otherwise) and `cum_log_probs` [1, 1].
- `num_return_sequences` n: n sequences sampled with seeds seed + i, as upstream's child requests;
  each response carries one, named by `sequence_index` [1, 1] (only when n > 1), and the final flag
  comes with the last response once every sequence is done.
- `guided_decoding_guide_type` / `guided_decoding_guide`: guided.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from llm_operator.runtime.cpu_reference.decoding import Job
from llm_operator.runtime.cpu_reference.structured.guided import GUIDE_TYPES, check_schema

# A batch slot per sequence: as the front door's bound on OpenAI's n.
MAX_SEQUENCES = 8


@dataclass(frozen=True)
class Extras:
    sequences: int = 1
    log_probs: bool = False
    guide_type: str = ""  # "": not guided
    guide: str = ""


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def extras(first: Callable[[str, Any], Any], decoupled: bool) -> Extras | str:
    """A request's extras read with first(name, default), or why they are refused."""
    n = int(first("num_return_sequences", 1))
    if not 1 <= n <= MAX_SEQUENCES:
        return f"num_return_sequences must be 1..{MAX_SEQUENCES}"
    if n > 1 and not decoupled:
        return "num_return_sequences > 1 needs a decoupled model (runtime.streaming: true)"
    guide_type = _text(first("guided_decoding_guide_type", ""))
    guide = _text(first("guided_decoding_guide", ""))
    if guide_type and guide_type not in GUIDE_TYPES:
        # Upstream drops an unknown type and runs unguided; a refusal says what happened.
        return f"guided_decoding_guide_type must be one of {', '.join(GUIDE_TYPES)}"
    if guide_type not in ("", "json") and not guide:
        return f"guided_decoding_guide_type {guide_type} needs guided_decoding_guide"
    if guide_type == "json_schema" and (problem := check_schema(guide)):
        return problem
    return Extras(n, bool(first("return_log_probs", False)), guide_type, guide)


def outputs(
    job: Job, ids: list[int], log_probs: list[float] | None, sequences: int
) -> dict[str, np.ndarray[Any, Any]]:
    """A response's tensors: `ids` (output_ids), `log_probs` (their generated ids' log-probabilities
    when the request returns them)."""
    tensors: dict[str, np.ndarray[Any, Any]] = {
        "output_ids": np.array([[ids]], dtype=np.int32),
        "sequence_length": np.array([[len(ids)]], dtype=np.int32),
    }
    if log_probs is not None:
        tensors["output_log_probs"] = np.array([[log_probs]], dtype=np.float32).reshape(1, 1, len(log_probs))
        tensors["cum_log_probs"] = np.array([[job.logprob]], dtype=np.float32)
    if sequences > 1:
        tensors["sequence_index"] = np.array([[job.index]], dtype=np.int32)
    return tensors


def step_outputs(job: Job, sequences: int) -> dict[str, np.ndarray[Any, Any]]:
    """A streaming sequence's ids since its previous response (none at a guided end)."""
    new = job.ids[job.sent :]
    job.sent = len(job.ids)
    log_probs = job.logprobs[len(job.logprobs) - len(new) :] if job.extra.get("log_probs") else None
    return outputs(job, new, log_probs, sequences)


def result_outputs(job: Job, sequences: int) -> dict[str, np.ndarray[Any, Any]]:
    """A sequence's whole answer (the prompt's ids first unless exclude_input_in_output)."""
    ids = job.ids if job.exclude_input else job.prompt_ids + job.ids
    return outputs(job, ids, list(job.logprobs) if job.extra.get("log_probs") else None, sequences)
