"""The front door's n, logprobs and response_format (pure): their checks and refusals by backend
(frontdoor/structured.py), the engine contract's inputs for them, the model's responses read
(upstream.py), and the choices made of them (choices.py): entries aligned with the text of their
chunk, chunks interleaved by index, usage summed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest
from llm_operator.contract import XGRAMMAR_TOKENIZER_INFO
from llm_operator.frontdoor import __main__ as frontdoor_main
from llm_operator.frontdoor import choices as C
from llm_operator.frontdoor import protocol as P
from llm_operator.frontdoor import structured as S
from llm_operator.frontdoor import triton_inputs as T
from llm_operator.frontdoor.upstream import Answer, UpstreamError, _answer

from tests import upstream_names as up

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def extras(kind: str = "chat", backend: str = "cpu-reference", unguided: str = "", **body: Any) -> P.Extras:
    return S.extras(body, kind, backend, unguided=unguided)


def refused(
    kind: str = "chat", backend: str = "cpu-reference", unguided: str = "", **body: Any
) -> P.ApiError:
    with pytest.raises(P.ApiError) as e:
        extras(kind, backend, unguided, **body)
    assert e.value.status == 400
    return e.value


def test_response_format_maps_to_the_engines_guide() -> None:
    assert extras(response_format={"type": "text"}) == P.Extras()
    assert extras(response_format={"type": "json_object"}) == P.Extras(guide_type="json")
    schema_format = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": True}}
    got = extras(response_format=schema_format)
    assert got.guide_type == "json_schema" and json.loads(got.guide) == SCHEMA  # the schema, not its wrapper
    inputs = T.triton_inputs(gen(got), "cpu-reference", True)
    assert (
        inputs["guided_decoding_guide_type"] == "json_schema" and inputs["guided_decoding_guide"] == got.guide
    )
    json_only = T.triton_inputs(gen(P.Extras(guide_type="json")), "cpu-reference", True)
    assert json_only["guided_decoding_guide_type"] == "json" and "guided_decoding_guide" not in json_only


def test_response_format_refusals() -> None:
    big = {"type": "object", "description": "x" * (S.MAX_SCHEMA_BYTES + 1)}
    bad = "invalid_json_schema"
    for value, code in (({"type": "json_schema", "json_schema": {"name": "a", "schema": big}}, bad),
                        ({"type": "json_schema", "json_schema": {"name": "a", "schema": [1]}}, bad),
                        ({"type": "json_schema", "json_schema": {"name": "a"}}, bad),
                        ({"type": "regex", "regex": "a+"}, "unsupported_parameter"),
                        ({"type": "structural_tag"}, "unsupported_parameter")):  # fmt: skip
        e = refused(response_format=value)
        assert (e.param, e.code) == ("response_format", code), value
    # An engine without its tokenizer info file serves without a guided decoder (runtime/launcher.py).
    e = refused(
        backend="tensorrt-engine", unguided=S.NO_TOKENIZER_INFO, response_format={"type": "json_object"}
    )
    assert (e.param, e.code) == ("response_format", "unsupported_parameter")
    assert "(tensorrt-engine): its engine has no xgrammar tokenizer info" in e.message


def test_the_pod_says_whether_its_engine_has_a_guided_decoder(tmp_path: Path) -> None:
    """The front door checks what the launcher checks (runtime/launcher.py): a tensorrt-engine pod's
    engine directory without a tokenizer info file the guided decoder can load serves unguided, a
    torn file as a missing one; the other backends always have a guided decoder."""
    env = {"LLMOP_SERVED_MODEL_NAMES": "m", "LLMOP_ENGINE_DIR": str(tmp_path)}
    assert frontdoor_main.settings(env).unguided == S.NO_TOKENIZER_INFO  # built before the file
    assert frontdoor_main.settings({"LLMOP_SERVED_MODEL_NAMES": "m"}).unguided == S.NO_TOKENIZER_INFO
    for backend in ("pytorch", "cpu-reference"):
        assert frontdoor_main.settings({**env, "LLMOP_BACKEND": backend}).unguided == ""
    info = json.dumps(up.XGRAMMAR_TOKENIZER_INFO_EXAMPLE)
    for torn in (info[: len(info) // 2], "{}"):
        (tmp_path / XGRAMMAR_TOKENIZER_INFO).write_text(torn)
        assert frontdoor_main.settings(env).unguided == S.NO_TOKENIZER_INFO, torn
    (tmp_path / XGRAMMAR_TOKENIZER_INFO).write_text(info)
    assert frontdoor_main.settings(env).unguided == ""


@pytest.mark.parametrize("stream", [True, False])
def test_response_format_on_the_gpu_engine_is_the_cpu_runtimes_guide(stream: bool) -> None:
    """tensorrt-engine sends the engine contract's two guide inputs to `tensorrt_llm`, as the CPU
    runtime's engine contract takes them (runtime/cpu_reference/structured/guided.py)."""
    schema_format = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": True}}
    for response_format, guide_type in (({"type": "json_object"}, "json"), (schema_format, "json_schema")):
        got = extras(backend="tensorrt-engine", response_format=response_format)
        assert got == extras(backend="cpu-reference", response_format=response_format)
        inputs = T.triton_inputs(gen(got, prompt_ids=[1, 2]), "tensorrt-engine", stream, end_id=2)
        assert inputs["guided_decoding_guide_type"] == guide_type
        assert inputs.get("guided_decoding_guide") == (got.guide or None)
        assert (inputs["input_ids"], inputs["end_id"]) == ([1, 2], 2)
    assert json.loads(got.guide) == SCHEMA
    # Still refused there: alternatives (the engine returns the sampled token's log-probability only).
    e = refused(backend="tensorrt-engine", logprobs=True, top_logprobs=1, response_format=schema_format)
    assert (e.param, e.code) == ("top_logprobs", "unsupported_parameter")


def test_n_and_logprobs_by_backend() -> None:
    for backend in ("cpu-reference", "tensorrt-engine"):
        assert extras(backend=backend, n=8, logprobs=True, top_logprobs=0) == P.Extras(n=8, logprobs=True)
        assert extras("completion", backend, logprobs=0) == P.Extras(logprobs=True)
        inputs = T.triton_inputs(gen(P.Extras(n=3, logprobs=True)), backend, True)
        assert (inputs["num_return_sequences"], inputs["return_log_probs"]) == (3, True)
    assert "num_return_sequences" not in T.triton_inputs(gen(P.Extras()), "cpu-reference", True)
    assert extras(logprobs=False, n=1) == P.Extras()
    cases: list[tuple[str, str, dict[str, Any], str, str | None]] = [
        # The PyTorch backend's alternatives wait for a GPU check.
        ("chat", "pytorch", {"logprobs": True, "top_logprobs": 1}, "top_logprobs", "unsupported_parameter"),
        ("completion", "pytorch", {"logprobs": 2}, "logprobs", "unsupported_parameter"),
        (
            "chat",
            "cpu-reference",
            {"logprobs": True, "top_logprobs": 2},
            "top_logprobs",
            "unsupported_parameter",
        ),
        ("completion", "tensorrt-engine", {"logprobs": 1}, "logprobs", "unsupported_parameter"),
        ("chat", "cpu-reference", {"top_logprobs": 2}, "top_logprobs", None),  # needs logprobs: true
        ("chat", "cpu-reference", {"top_logprobs": 21, "logprobs": True}, "top_logprobs", None),
        ("chat", "cpu-reference", {"n": 9}, "n", None),
        ("chat", "cpu-reference", {"n": 0}, "n", None),
        ("chat", "cpu-reference", {"logprobs": 1}, "logprobs", None),
    ]
    for kind, backend, body, param, code in cases:
        e = refused(kind, backend, **body)
        assert (e.param, e.code) == (param, code), (kind, backend, body)


def test_the_llm_api_contract_sends_the_wrappers_inputs() -> None:
    """pytorch (and cpu-reference's llmapi contract): n, logprobs (the sampled token's: k 0) and
    the guide under the operator's wrapper's names (runtime/llmapi_structured.py)."""
    schema_format = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
    got = extras(backend="pytorch", n=3, logprobs=True, top_logprobs=0, response_format=schema_format)
    assert (got.n, got.logprobs, got.guide_type, json.loads(got.guide)) == (3, True, "json_schema", SCHEMA)
    inputs = T.triton_inputs(gen(got), "pytorch", True)
    wanted = {"sampling_param_n": 3, "sampling_param_logprobs": 0,
              "guided_decoding_guide_type": "json_schema", "guided_decoding_guide": got.guide}  # fmt: skip
    assert {k: inputs.get(k) for k in wanted} == wanted
    assert extras("completion", "pytorch", logprobs=0) == P.Extras(logprobs=True)
    plain = T.triton_inputs(gen(P.Extras()), "pytorch", False)
    assert not {"sampling_param_n", "sampling_param_logprobs", "guided_decoding_guide_type"} & set(plain)
    assert "num_return_sequences" not in inputs and "return_log_probs" not in inputs


def test_the_protocol_accepts_the_parameters_structured_checks() -> None:
    body = {"model": "m", "messages": [], "n": 2, "logprobs": True, "top_logprobs": 0,
            "response_format": {"type": "json_object"}}  # fmt: skip
    P.check(body, "chat", P.Limits(), backend="cpu-reference")  # no unknown or unsupported parameter


def test_the_models_responses_name_their_sequence_and_log_probs() -> None:
    one = _answer({"output_ids": 7, "sequence_length": 1, "sequence_index": 2, "output_log_probs": -0.5})
    assert (one.ids, one.index, one.log_probs) == ((7,), 2, (-0.5,))
    # All the log-probabilities so far, or those of the new ids: the trailing ones are the new ids'.
    two = _answer({"output_ids": [8, 9], "sequence_length": 2, "output_log_probs": [-0.5, -1.0, -2.0]})
    assert (two.index, two.log_probs) == (0, (-1.0, -2.0))
    with pytest.raises(UpstreamError):
        _answer({"output_ids": [8, 9], "sequence_length": 2, "output_log_probs": [-1.0]})


def gen(extras: P.Extras, kind: str = "chat", **fields: Any) -> P.Generation:
    return P.Generation(kind=kind, model="m", prompt="", max_tokens=10, extras=extras, **fields)


def answer(index: int, pieces: list[str], log_probs: list[float], ids: list[int] | None = None) -> Answer:
    ids = ids or [ord(p[0]) if p else 0 for p in pieces]
    return Answer("".join(pieces), None, tuple(ids), index, tuple(log_probs), tuple(pieces))


def test_entries_go_with_the_text_of_their_ids() -> None:
    choice = C.Choice(0, ["STOP"])
    # An id DecodeStream holds back ("") goes with the id that completes its character.
    assert choice.feed(answer(0, ["a", ""], [-1.0, -2.0], [97, 195])) == ("a", [C.Entry(97, -1.0, 0, 1)])
    out, entries = choice.feed(answer(0, ["é"], [-3.0], [169]))
    assert out == "é" and [e.id for e in entries] == [195, 169]
    # Text a stop sequence may start is held, and its ids' entries with it; the cut drops them.
    assert choice.feed(answer(0, ["S", "T"], [-4.0, -5.0])) == ("", [])
    assert choice.feed(answer(0, ["O", "P", "z"], [-6.0, -7.0, -8.0])) == ("", [])
    assert choice.done and choice.flush() == ("", [])
    assert choice.text == "aé" and [e.logprob for e in choice.entries] == [-1.0, -2.0, -3.0]


def test_held_text_released_at_the_end_brings_its_entries_and_the_end_tokens() -> None:
    choice = C.Choice(0, ["xyz"])
    assert choice.feed(answer(0, ["a", "x"], [-1.0, -2.0])) == ("a", [C.Entry(ord("a"), -1.0, 0, 1)])
    choice.feed(answer(0, [""], [-3.0], [2]))  # the end token: no text
    tail, entries = choice.flush()
    assert tail == "x" and [e.logprob for e in entries] == [-2.0, -3.0]
    assert [e.logprob for e in choice.entries] == [-1.0, -2.0, -3.0]


class Peer:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    async def event(self, obj: dict[str, Any]) -> None:
        self.events.append(obj)


async def replay(answers: list[Answer]) -> AsyncGenerator[Answer, None]:
    for a in answers:
        yield a


def run_stream(g: P.Generation, answers: list[Answer]) -> list[dict[str, Any]]:
    peer = Peer()

    def usage(choices: list[C.Choice]) -> dict[str, int]:
        return {"prompt_tokens": 1, "completion_tokens": sum(c.count for c in choices)}

    async def go() -> None:
        pieces = replay(answers[1:])
        await C.stream(peer, g, answers[0], pieces, usage, lambda i: chr(i))  # type: ignore[arg-type]

    asyncio.run(go())
    return peer.events


def test_n_streams_interleaved_by_index_with_per_choice_finish_and_summed_usage() -> None:
    g = gen(P.Extras(n=2, logprobs=True), stop=["!"], include_usage=True)
    g.max_tokens = 3
    events = run_stream(g, [answer(1, ["b"], [-1.0]), answer(0, ["a"], [-2.0]), answer(1, ["!"], [-3.0]),
                            answer(0, ["c"], [-4.0]), answer(0, ["d"], [-5.0])])  # fmt: skip
    firsts = [e["choices"][0] for e in events if e["choices"]]
    chunks = [(c["index"], c["delta"].get("content"), c["finish_reason"], c["logprobs"]) for c in firsts]

    def entry(token: str, logprob: float) -> dict[str, Any]:
        return {"content": [{"token": token, "logprob": logprob, "bytes": [ord(token)], "top_logprobs": []}]}

    assert chunks == [
        (1, "b", None, entry("b", -1.0)), (0, "a", None, entry("a", -2.0)), (0, "c", None, entry("c", -4.0)),
        (0, "d", None, entry("d", -5.0)), (0, None, "length", None), (1, None, "stop", None),
    ]  # fmt: skip
    assert events[-1]["usage"] == {"prompt_tokens": 1, "completion_tokens": 5}  # both choices' ids


def test_whole_answers_have_a_choice_per_index() -> None:
    g = gen(P.Extras(n=2), kind="completion")

    async def go() -> list[C.Choice]:
        return await C.whole(g, answer(1, ["x"], []), replay([answer(0, ["y", "z"], [])]))

    got = asyncio.run(go())
    assert [(c.index, c.text, C.finish(c, g)) for c in got] == [(0, "yz", "stop"), (1, "x", "stop")]
    assert C.logprobs(g, got[0].entries, chr) is None  # not asked for
    with pytest.raises(UpstreamError, match="sequence_index 2"):
        asyncio.run(C.whole(g, answer(2, ["x"], []), replay([])))


def test_completions_logprobs_have_tokens_and_offsets() -> None:
    g = gen(P.Extras(logprobs=True), kind="completion")
    choice = C.Choice(0, [])
    choice.feed(answer(0, ["ab", "c"], [-1.0, -2.0], [5, 6]))
    assert C.logprobs(g, choice.entries, lambda i: f"<{i}>") == {
        "tokens": ["<5>", "<6>"],
        "token_logprobs": [-1.0, -2.0],
        "top_logprobs": None,
        "text_offset": [0, 2],
    }
