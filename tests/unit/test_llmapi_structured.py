"""The llmapi model's guided decoding, n and log probabilities (runtime/llmapi_structured.py, pure):
the inputs read into the LLM API's SamplingParams / GuidedDecodingParams keywords (pinned in
tests/upstream_names.py), refusals, and the LLM API's outputs written as the padded tensors the
front door reads back (frontdoor/upstream.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from types import SimpleNamespace
from typing import Any, NamedTuple

import numpy as np
import pytest
from llm_operator.frontdoor.upstream import UpstreamError, _answers
from llm_operator.runtime import llmapi_structured as L

from tests import upstream_names as up


class Logprob(NamedTuple):  # tensorrt_llm.executor.result.Logprob's shape
    logprob: float
    rank: int | None = None


def read(**values: Any) -> L.Extras:
    return L.extras(lambda name: values.get(name))


def test_inputs_map_to_the_llm_apis_keywords() -> None:
    assert read() == L.Extras() and L.Extras().sampling_params() == {}
    assert L.Extras().guided_decoding_params() is None
    got = read(sampling_param_n=np.int32(3), sampling_param_logprobs=np.int32(0))
    assert got.sampling_params() == {"n": 3, "logprobs": 0}
    for guide_type, guide, params in (
        (b"json", b"", {"json_object": True}),
        (b"json_schema", b'{"type":"object"}', {"json": '{"type":"object"}'}),
        (b"regex", b"a+", {"regex": "a+"}),
        (b"ebnf_grammar", b'root ::= "a"', {"grammar": 'root ::= "a"'}),
    ):
        extra = read(guided_decoding_guide_type=guide_type, guided_decoding_guide=guide)
        assert extra.guided_decoding_params() == params
        assert set(params) <= up.GUIDED_DECODING_PARAMS
    assert set(got.sampling_params()) | {"guided_decoding"} <= up.SAMPLING_PARAMS
    # The wrapper's inputs are the ones read.
    assert {"guided_decoding_guide_type", "guided_decoding_guide", "sampling_param_n",
            "sampling_param_logprobs"} == set(up.LLMAPI_WRAPPER_INPUTS)  # fmt: skip


@pytest.mark.parametrize(
    "values",
    [{"sampling_param_n": 0}, {"sampling_param_n": 9}, {"sampling_param_logprobs": -1},
     {"sampling_param_logprobs": 21},
     {"guided_decoding_guide_type": "structural_tag", "guided_decoding_guide": "x"},
     {"guided_decoding_guide_type": "regex"}],
)  # fmt: skip
def test_refusals(values: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"sampling_param|guided_decoding"):
        read(**values)


def sequence(ids: list[int], logprobs: list[Any]) -> SimpleNamespace:
    return SimpleNamespace(token_ids=ids, logprobs=logprobs)  # CompletionOutput's (COMPLETION_OUTPUT)


def test_outputs_are_rows_per_sequence_padded() -> None:
    assert L.outputs([sequence([1], [-0.5])], L.Extras()) == {}  # not asked for
    first = sequence(
        [5, 6], [{5: Logprob(-0.1, 1), 9: Logprob(-2.0, 2)}, {6: Logprob(-3.0, 3), 7: Logprob(-0.2, 1)}]
    )
    second = sequence([8], [-0.7])  # a float per position, as older LLM APIs give
    tensors = L.outputs([first, second], L.Extras(n=2, logprobs=1))
    assert tensors["output_ids"].tolist() == [[5, 6], [8, -1]]
    assert np.allclose(tensors["output_log_probs"], [[-0.1, -3.0], [-0.7, 0.0]])
    assert tensors["top_logprob_ids"].tolist() == [[[5], [7]], [[-1], [-1]]]
    assert np.allclose(tensors["top_logprobs"], [[[-0.1], [-0.2]], [[0.0], [0.0]]])
    assert set(tensors) == set(up.LLMAPI_WRAPPER_OUTPUTS)
    assert "top_logprobs" not in L.outputs([first], L.Extras(logprobs=0))


def test_the_front_door_reads_the_rows_back() -> None:
    """What Triton's generate API writes of them (flat lists; one element as a scalar)."""
    tensors = L.outputs([sequence([5, 6], [-0.1, -3.0]), sequence([8], [-0.7])], L.Extras(n=2, logprobs=0))
    response = {"text_output": ["ab", "c"], "finish_reason": ["stop", "None"]} | {
        name: value.reshape(-1).tolist() for name, value in tensors.items()
    }
    first, second = _answers(response, 2)
    assert (first.text, first.finish_reason, first.ids, first.index) == ("ab", "stop", (5, 6), 0)
    assert first.log_probs == pytest.approx((-0.1, -3.0))
    assert (second.text, second.finish_reason, second.ids, second.index) == ("c", None, (8,), 1)
    assert second.log_probs == pytest.approx((-0.7,))
    (one,) = _answers(
        {"text_output": "x", "finish_reason": "length", "output_ids": 4, "output_log_probs": -1.0}, 1
    )
    assert (one.text, one.finish_reason, one.ids, one.log_probs) == ("x", "length", (4,), (-1.0,))
    (plain,) = _answers({"text_output": "x"}, 1)
    assert (plain.ids, plain.log_probs) == ((), ())
    with pytest.raises(UpstreamError):
        _answers({"text_output": ["a", "b", "c"]}, 2)
    with pytest.raises(UpstreamError):
        _answers({"text_output": ["a", "b"], "output_ids": [1, 2, 3]}, 2)


def test_each_sequences_new_text_ids_and_log_probs() -> None:
    """The llmapi model sends each sequence's whole so far: the front door passes on the new part
    of each, the new ids' entries with the new text (server._deltas)."""
    from llm_operator.frontdoor.server import _deltas
    from llm_operator.frontdoor.upstream import Answer

    async def responses() -> AsyncGenerator[Answer, None]:
        for answer in (
            Answer("a", None, (1,), 0, (-1.0,)),
            Answer("x", None, (7,), 1, (-7.0,)),
            Answer("ab", None, (1, 2, 3), 0, (-1.0, -2.0, -3.0)),
            Answer("xy", "stop", (7, 8), 1, (-7.0, -8.0)),
        ):
            yield answer

    async def collect() -> list[Answer]:
        # Each id decoded alone; 8's does not spell its text (a character across ids, say).
        alone = {1: "a", 2: "b", 3: "", 7: "x", 8: "?"}
        return [a async for a in _deltas(responses(), alone.__getitem__)]

    got = asyncio.run(collect())
    assert [(a.index, a.text, a.ids, a.log_probs, a.pieces) for a in got] == [
        (0, "a", (1,), (-1.0,), ("a",)),
        (1, "x", (7,), (-7.0,), ("x",)),
        (0, "b", (2, 3), (-2.0, -3.0), ("b", "")),
        (1, "y", (8,), (-8.0,), ("y",)),  # then the new text is the last id's
    ]
    assert got[-1].finish_reason == "stop"
