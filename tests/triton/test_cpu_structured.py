"""The CPU runtime's `tensorrt_llm` model with the engine contract's guided decoding, log
probabilities and n sequences (upstream's names: guided_decoding_guide_type/_guide,
return_log_probs -> output_log_probs/cum_log_probs, num_return_sequences -> sequence_index), on a
real tritonserver through Triton's generate API, as the front door calls it."""

from __future__ import annotations

import json
import urllib.error
from collections import defaultdict
from typing import Any

import jsonschema
import pytest
from llm_operator.runtime.cpu_reference.tiny_lm import encode

from tests.triton.server import TritonProcess
from tests.triton.test_cpu_engine_ids import generate, ids_of

pytestmark = pytest.mark.triton

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["answer", "n"],
    "additionalProperties": False,
}


def inputs(**extra: Any) -> dict[str, Any]:
    prompt = encode("Answer in JSON: ")
    return {"input_ids": prompt, "input_lengths": len(prompt), "request_output_len": 100,
            "exclude_input_in_output": True, "runtime_top_k": 256, "seed": 11,
            "guided_decoding_guide_type": "json_schema", "guided_decoding_guide": json.dumps(SCHEMA),
            "return_log_probs": True, **extra}  # fmt: skip


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def test_n_guided_streamed_sequences_are_valid_and_each_a_single_request_with_seed_plus_i(
    streaming_server: TritonProcess,
) -> None:
    responses = generate(streaming_server, inputs(streaming=True, num_return_sequences=3), stream=True)
    ids: dict[int, list[int]] = defaultdict(list)
    log_probs: dict[int, list[float]] = defaultdict(list)
    for r in responses:
        new = ids_of(r)
        ids[r["sequence_index"]] += new
        log_probs[r["sequence_index"]] += as_list(r["output_log_probs"])[: len(new)] if new else []
    assert sorted(ids) == [0, 1, 2]
    for i, sequence in ids.items():
        jsonschema.validate(json.loads(bytes(sequence).decode()), SCHEMA)
        assert len(log_probs[i]) == len(sequence) and all(p < 0 for p in log_probs[i])
        (alone,) = generate(streaming_server, inputs(seed=11 + i), stream=True)  # decoupled, one answer
        assert ids_of(alone) == sequence
        assert as_list(alone["output_log_probs"]) == pytest.approx(log_probs[i], abs=1e-5)
        assert alone["cum_log_probs"] == pytest.approx(sum(log_probs[i]), abs=1e-4)
        assert "sequence_index" not in alone


def test_a_bad_guide_is_a_400_naming_it(streaming_server: TritonProcess) -> None:
    for bad, message in (({"guided_decoding_guide": "[1]"}, "must be a JSON object"),
                         ({"guided_decoding_guide_type": "structural_tag"}, "must be one of")):  # fmt: skip
        with pytest.raises(urllib.error.HTTPError) as e:
            generate(streaming_server, inputs(**bad), stream=False)
        assert e.value.code == 400 and message in e.value.read().decode()
