"""The CPU runtime's guided decoding, log probabilities and n sequences (runtime/cpu_reference:
guided.py, decoding.steps, sequences.py) on the tiny model, without Triton."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
import torch
from llm_operator.runtime.cpu_reference import TINY_MODELS
from llm_operator.runtime.cpu_reference.decoding import Job, Limits, Sampling, job, steps
from llm_operator.runtime.cpu_reference.served import BYTES
from llm_operator.runtime.cpu_reference.structured.guided import Matcher, Vocabulary
from llm_operator.runtime.cpu_reference.structured.sequences import (
    Extras,
    extras,
    result_outputs,
    step_outputs,
)
from llm_operator.runtime.cpu_reference.tiny_lm import TinyLM

SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"enum": ["yes", "no"]},
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "s": {"type": "string", "maxLength": 5},
    },
    "required": ["answer", "ok", "n", "s"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def lm() -> TinyLM:
    return TinyLM(TINY_MODELS["tiny-llama"], seed=1)


@pytest.fixture(scope="module")
def vocabulary(lm: TinyLM) -> Vocabulary:
    return Vocabulary.of_bytes(lm.embed.shape[0])


def decode(lm: TinyLM, prompt: str, seeds: range, *, grammar: Any = None, vocabulary: Vocabulary | None = None,  # noqa: E501
           max_tokens: int = 120, logprobs: bool = False, **knobs: Any) -> list[Job]:  # fmt: skip
    """One job per seed, decoded in one batch."""
    jobs = []
    for seed in seeds:
        guide = None if grammar is None or vocabulary is None else Matcher(grammar, vocabulary.vocab_size)
        sampling = Sampling(max_tokens=max_tokens, seed=seed, **knobs)
        one = job(
            lm,
            BYTES,
            Limits(512, 1024),
            None,
            prompt,
            sampling,
            stream=False,
            exclude_input=True,
            guide=guide,
        )
        assert isinstance(one, Job)
        jobs.append(one)
    steps(lm, jobs, lambda j, piece: None, lambda batch, active: None, logprobs=logprobs)
    return jobs


def test_schema_guided_outputs_are_valid_for_200_seeds(lm: TinyLM, vocabulary: Vocabulary) -> None:
    grammar = vocabulary.grammar("json_schema", json.dumps(SCHEMA))
    jobs = decode(lm, "Answer in JSON: ", range(200), grammar=grammar, vocabulary=vocabulary, top_k=256)
    for j in jobs:
        jsonschema.validate(json.loads(j.generated), SCHEMA)
        assert j.finish_reason == "stop", j.generated  # the grammar's end, long before max_tokens
    assert len({j.generated for j in jobs}) > 100  # sampled, not one answer


def test_regex_guide_and_an_unguided_batch_mate(lm: TinyLM, vocabulary: Vocabulary) -> None:
    grammar = vocabulary.grammar("regex", r"(yes|no)-[0-9]{2}")
    guided = decode(lm, "x", range(30), grammar=grammar, vocabulary=vocabulary, top_k=256)
    assert all(re.fullmatch(r"(yes|no)-[0-9]{2}", j.generated) and j.finish_reason == "stop" for j in guided)
    # Unguided, the same seeds run to max_tokens (the tiny model has no end token).
    plain = decode(lm, "x", range(3), top_k=256, max_tokens=20)
    assert [j.finish_reason for j in plain] == ["length"] * 3


def test_a_completed_grammar_offers_the_end_token(vocabulary: Vocabulary) -> None:
    lm = TinyLM(TINY_MODELS["tiny-llama"], seed=1)
    lm.pickable, lm.end_id = (32, 127), 127  # type: ignore[assignment]  # as a model with an end token: DEL ends
    with_end = Vocabulary([bytes([i]) for i in range(256)], vocabulary.vocab_size, [127])
    grammar = with_end.grammar("json_schema", json.dumps(SCHEMA))
    for j in decode(lm, "Answer: ", range(20), grammar=grammar, vocabulary=with_end, top_k=256):
        assert j.finish_reason == "stop" and j.ids[-1] == 127 and j.ids.count(127) == 1
        jsonschema.validate(json.loads(j.generated[:-1]), SCHEMA)


def test_a_guide_that_does_not_compile_is_refused(vocabulary: Vocabulary) -> None:
    with pytest.raises(ValueError, match="does not compile as json_schema"):
        vocabulary.grammar("json_schema", json.dumps({"type": "no-such-type"}))
    with pytest.raises(ValueError, match="must be one of"):
        vocabulary.grammar("structural_tag", "{}")


def test_log_probs_are_log_softmax_before_the_knobs_and_the_mask(lm: TinyLM, vocabulary: Vocabulary) -> None:
    grammar = vocabulary.grammar("json_schema", json.dumps(SCHEMA))
    (one,) = decode(lm, "Answer: ", range(7, 8), grammar=grammar, vocabulary=vocabulary, logprobs=True,
                    top_k=40, temperature=0.7)  # fmt: skip
    batch = lm.start([BYTES.encode("Answer: ")])
    expected = []
    for token in one.ids:
        expected.append(float(torch.log_softmax(batch.logits[0], dim=-1)[token]))
        batch.advance([token])
    assert one.logprobs == pytest.approx(expected, abs=1e-9)
    assert one.logprob == pytest.approx(sum(expected))


def test_sequence_i_of_n_is_a_single_request_with_seed_plus_i(lm: TinyLM, vocabulary: Vocabulary) -> None:
    grammar = vocabulary.grammar("json_schema", json.dumps(SCHEMA))
    knobs: dict[str, Any] = {"grammar": grammar, "vocabulary": vocabulary, "top_k": 256, "logprobs": True}
    together = decode(lm, "Answer: ", range(5, 9), **knobs)
    for i, sequence in enumerate(together):
        (alone,) = decode(lm, "Answer: ", range(5 + i, 6 + i), **knobs)
        assert sequence.generated == alone.generated
        assert sequence.logprobs == pytest.approx(alone.logprobs, abs=1e-9)  # batched: rounding apart
    assert len({s.generated for s in together}) == 4


def first(values: dict[str, Any]) -> Any:
    return lambda name, default: values.get(name, default)


def test_extras_read_and_refused() -> None:
    read = {"num_return_sequences": 3, "return_log_probs": True, "guided_decoding_guide_type": b"json"}
    assert extras(first(read), True) == Extras(3, True, "json", "")
    refusals: dict[str, dict[str, Any]] = {
        "num_return_sequences must be 1..8": {"num_return_sequences": 9},
        "needs a decoupled model": {"num_return_sequences": 2, "decoupled": False},
        "guided_decoding_guide_type must be one of": {"guided_decoding_guide_type": b"structural_tag"},
        "regex needs guided_decoding_guide": {"guided_decoding_guide_type": b"regex"},
        "guided_decoding_guide must be a JSON object": {
            "guided_decoding_guide_type": b"json_schema", "guided_decoding_guide": b"[1]"},
    }  # fmt: skip
    for message, inputs in refusals.items():
        refused = extras(first(inputs), bool(inputs.pop("decoupled", True)))
        assert isinstance(refused, str) and message in refused, (message, refused)


def test_responses_carry_the_new_ids_log_probs_and_sequence_index(lm: TinyLM) -> None:
    (one,) = decode(lm, "ab", range(1), max_tokens=3, logprobs=True, top_k=256)
    one.extra["log_probs"], one.index = True, 2
    one.sent = 1
    streamed = step_outputs(one, 4)
    assert streamed["output_ids"].tolist() == [[one.ids[1:]]]
    assert streamed["output_log_probs"][0, 0].tolist() == pytest.approx(one.logprobs[1:])
    assert streamed["sequence_index"].tolist() == [[2]]
    assert step_outputs(one, 4)["output_ids"].shape == (1, 1, 0)  # nothing new: a guided end's final response
    whole = result_outputs(one, 1)
    assert whole["output_ids"].tolist() == [[one.ids]] and "sequence_index" not in whole
    assert whole["cum_log_probs"][0, 0] == pytest.approx(sum(one.logprobs), rel=1e-6)
    one.extra["log_probs"] = False
    assert "output_log_probs" not in result_outputs(one, 1)
