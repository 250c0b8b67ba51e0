"""The CPU runtime's `tensorrt_llm` model on a real tritonserver, called as the OpenAI front door
calls it (Triton's generate API, upstream's input names): the prompt's ids in, the model's ids
out; streaming, one response per new id (the C++ backend's responses hold the ids since the
previous one), not streaming, all of them at once; the same ids either way, and the same text the
ensemble's text contract serves for the same prompt."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from llm_operator.runtime.cpu_reference.tiny_lm import encode

from tests.triton.conftest import expected
from tests.triton.server import TritonProcess

pytestmark = pytest.mark.triton

PROMPT, TOKENS = "Once upon a time", 12


def generate(server: TritonProcess, body: dict[str, Any], stream: bool) -> list[dict[str, Any]]:
    path = "generate_stream" if stream else "generate"
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.http_port}/v2/models/tensorrt_llm/{path}", json.dumps(body).encode()
    )
    with urllib.request.urlopen(request, timeout=60) as r:
        raw = r.read().decode()
    if not stream:
        return [json.loads(raw)]
    return [json.loads(line[5:]) for line in raw.splitlines() if line.startswith("data:")]


def ids_of(response: dict[str, Any]) -> list[int]:
    """output_ids cut at sequence_length: one id comes as a number, several as a flat list."""
    ids, length = response["output_ids"], response["sequence_length"]
    ids = ids if isinstance(ids, list) else [ids]
    assert isinstance(length, int)
    return list(ids[:length])


def inputs(**extra: Any) -> dict[str, Any]:
    prompt = encode(PROMPT)
    return {"input_ids": prompt, "input_lengths": len(prompt), "request_output_len": TOKENS,
            "exclude_input_in_output": True, "runtime_top_k": 1, **extra}  # fmt: skip


def test_streaming_sends_each_new_id_and_the_ids_are_the_models(streaming_server: TritonProcess) -> None:
    responses = generate(streaming_server, inputs(streaming=True), stream=True)
    assert [len(ids_of(r)) for r in responses] == [1] * TOKENS
    ids = [i for r in responses for i in ids_of(r)]
    assert bytes(ids).decode() == expected(PROMPT, TOKENS)  # the tiny model's ids are its bytes
    (whole,) = generate(streaming_server, inputs(), stream=True)  # decoupled, not streaming: one answer
    assert ids_of(whole) == ids


def test_without_streaming_all_ids_come_at_once(batch_server: TritonProcess) -> None:
    (whole,) = generate(batch_server, inputs(), stream=False)
    assert bytes(ids_of(whole)).decode() == expected(PROMPT, TOKENS)
    (echoed,) = generate(batch_server, inputs(exclude_input_in_output=False), stream=False)
    assert ids_of(echoed) == encode(PROMPT) + ids_of(whole)


def test_ids_outside_the_vocabulary_are_refused(batch_server: TritonProcess) -> None:
    with pytest.raises(urllib.error.HTTPError) as e:
        generate(batch_server, inputs(input_ids=[70000], input_lengths=1), stream=False)
    assert e.value.code == 400 and "vocabulary" in e.value.read().decode()
