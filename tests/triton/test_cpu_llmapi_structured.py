"""The CPU runtime's llmapi model with the operator's wrapper's guided decoding, n and log
probabilities (runtime/llmapi_structured.py: guided_decoding_guide_type/_guide, sampling_param_n,
sampling_param_logprobs -> text_output [n], output_ids / output_log_probs [n, len] padded with -1,
top_logprob_ids / top_logprobs [n, len, k]), on a real tritonserver through Triton's generate API,
as the front door calls it."""

from __future__ import annotations

import json
import urllib.error
from collections.abc import Iterator
from typing import Any

import jsonschema
import numpy as np
import pytest

from tests.triton.conftest import serve
from tests.triton.server import TritonProcess
from tests.triton.test_cpu_llmapi import generate, llmapi_spec, stream
from tests.triton.test_cpu_structured import SCHEMA

pytestmark = pytest.mark.triton

PROMPT, MAX_TOKENS, K = "Answer in JSON: ", 100, 3


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonProcess]:
    yield from serve(tmp_path_factory.mktemp("triton-llmapi-structured"), llmapi_spec())


def guided(**extra: Any) -> dict[str, Any]:
    return {"sampling_param_top_k": 256, "sampling_param_seed": 11, "sampling_param_logprobs": K,
            "guided_decoding_guide_type": "json_schema", "guided_decoding_guide": json.dumps(SCHEMA),
            **extra}  # fmt: skip


def rows(response: dict[str, Any], n: int) -> list[tuple[str, list[int], list[float], np.ndarray[Any, Any]]]:
    """Each sequence's (text, ids, log-probabilities, top [len, k] log-probabilities), padding cut."""
    texts = response["text_output"] if n > 1 else [response["text_output"]]
    ids = np.array(response["output_ids"]).reshape(n, -1)
    log_probs = np.array(response["output_log_probs"]).reshape(n, -1)
    top = np.array(response["top_logprobs"]).reshape(n, ids.shape[1], K)
    out = []
    for i in range(n):
        length = int((ids[i] >= 0).sum())
        out.append((texts[i], ids[i, :length].tolist(), log_probs[i, :length].tolist(), top[i, :length]))
    return out


def test_n_guided_sequences_are_valid_each_a_single_request_with_seed_plus_i(server: TritonProcess) -> None:
    events = stream(server, PROMPT, MAX_TOKENS, sampling_param_n=3, return_finish_reason=True, **guided())
    assert len(events) > 1 and all(len(e["text_output"]) == 3 for e in events)  # every response: all three
    last = events[-1]
    assert last["finish_reason"] == ["stop"] * 3  # each reached its grammar's end
    sequences = rows(last, 3)
    for i, (text, ids, log_probs, top) in enumerate(sequences):
        jsonschema.validate(json.loads(text), SCHEMA)
        assert bytes(ids).decode() == text  # the tiny model: a byte a token
        assert all(p < 0 for p in log_probs)
        # The k likeliest of the model's own distribution, best first; the sampled one among them or below.
        assert (np.diff(top, axis=1) <= 0).all() and (top[:, 0] >= np.array(log_probs) - 1e-6).all()
        alone = generate(server, PROMPT, MAX_TOKENS, **guided(sampling_param_seed=11 + i))
        ((alone_text, alone_ids, alone_log_probs, _),) = rows(alone, 1)
        assert (alone_text, alone_ids) == (text, ids)
        assert alone_log_probs == pytest.approx(log_probs, abs=1e-5)
    assert len({s[0] for s in sequences}) > 1


def test_json_object_and_plain_requests(server: TritonProcess) -> None:
    whole = generate(server, PROMPT, MAX_TOKENS, sampling_param_top_k=256, guided_decoding_guide_type="json")
    assert isinstance(json.loads(whole["text_output"]), dict | list)
    plain = generate(server, PROMPT, 4)
    assert not {"output_ids", "output_log_probs", "top_logprobs"} & set(plain)  # only when asked


@pytest.mark.parametrize(
    ("extra", "message"),
    [({"sampling_param_n": 9}, "sampling_param_n"),
     ({"guided_decoding_guide_type": "structural_tag", "guided_decoding_guide": "x"},
      "guided_decoding_guide_type"),
     ({"guided_decoding_guide_type": "json_schema", "guided_decoding_guide": "[1]"}, "JSON object"),
     ({"guided_decoding_guide_type": "regex", "guided_decoding_guide": "("}, "does not compile")],
)  # fmt: skip
def test_refusals_name_the_input(server: TritonProcess, extra: dict[str, Any], message: str) -> None:
    with pytest.raises(urllib.error.HTTPError) as e:
        generate(server, PROMPT, 4, **extra)
    assert e.value.code == 400 and message in e.value.read().decode()
