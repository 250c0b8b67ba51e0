"""The front door's request checks and its translation to Triton's generate inputs (pure)."""

from __future__ import annotations

from typing import Any

import pytest
from llm_operator.frontdoor import protocol as P

LIMITS = P.Limits(max_input_len=100, max_seq_len=200)


def check(kind: str = "completion", penalties: bool = False, **body: Any) -> P.Generation:
    return P.check({"model": "m", **body}, kind, LIMITS, penalties=penalties)


def refused(**body: Any) -> P.ApiError:
    with pytest.raises(P.ApiError) as e:
        check(**body)
    return e.value


@pytest.mark.parametrize(
    ("body", "param"),
    [({"n": 2}, "n"), ({"best_of": 2}, "best_of"), ({"logprobs": 1}, "logprobs"), ({"echo": True}, "echo"),
     ({"suffix": "x"}, "suffix"), ({"logit_bias": {"1": 5}}, "logit_bias"),
     ({"top_logprobs": 2}, "top_logprobs"),
     ({"tools": [{"type": "function"}]}, "tools"), ({"tool_choice": "auto"}, "tool_choice"),
     ({"response_format": {"type": "json_object"}}, "response_format"), ({"functions": [{}]}, "functions"),
     ({"presence_penalty": 0.5}, "presence_penalty"), ({"frequency_penalty": -1}, "frequency_penalty")],
)  # fmt: skip
def test_what_the_backend_cannot_honour_is_refused_by_name(body: dict[str, Any], param: str) -> None:
    e = refused(**body)
    assert (e.status, e.param, e.code) == (400, param, "unsupported_parameter")
    assert param in e.message and "remove" in e.message


def test_defaults_of_unsupported_parameters_pass_as_sdks_send_them() -> None:
    gen = check(
        n=1, best_of=1, logprobs=None, echo=False, presence_penalty=0, frequency_penalty=0.0, user="u"
    )
    assert gen.max_tokens == 16  # OpenAI's default for completions


def test_penalties_pass_where_the_engine_takes_them() -> None:
    gen = check(penalties=True, presence_penalty=0.5, frequency_penalty=-1)
    inputs = P.triton_inputs(gen, "tensorrt-engine", stream=True)
    assert (inputs["presence_penalty"], inputs["frequency_penalty"]) == (0.5, -1.0)


def test_unknown_parameters_are_named() -> None:
    e = refused(temprature=0.5)
    assert (e.param, e.code) == ("temprature", "unknown_parameter")


@pytest.mark.parametrize(
    ("body", "param"),
    [({"temperature": 3}, "temperature"), ({"top_p": -0.1}, "top_p"), ({"seed": -1}, "seed"),
     ({"seed": 2**64}, "seed"), ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": "8"}, "max_tokens"),
     ({"temperature": True}, "temperature"), ({"stop": 5}, "stop"), ({"stop": ["a"] * 5}, "stop"),
     ({"stream": "yes"}, "stream"), ({"stream_options": {"include_usage": True}}, "stream_options"),
     ({"model": ""}, "model")],
)  # fmt: skip
def test_out_of_range_values_are_refused_with_the_field(body: dict[str, Any], param: str) -> None:
    assert refused(**body).param == param


def test_max_tokens_beyond_max_seq_len_says_the_limit() -> None:
    e = refused(max_tokens=500)
    assert e.param == "max_tokens" and "maxSeqLen of 200" in e.message


def test_the_prompt_is_fitted_to_the_engines_limits() -> None:
    gen = check(max_tokens=150)
    with pytest.raises(P.ApiError, match="maxInputLen of 100") as e:
        P.fit(gen, 101, LIMITS)
    assert (e.value.param, e.value.code) == ("prompt", "context_length_exceeded")
    with pytest.raises(P.ApiError, match="at most 140 tokens"):
        P.fit(gen, 60, LIMITS)
    P.fit(gen, 50, LIMITS)
    chat = check("chat", messages=[])
    P.fit(chat, 60, LIMITS)
    assert chat.max_tokens == 140  # chat without max_tokens: what maxSeqLen leaves


def test_max_completion_tokens_is_chats_max_tokens() -> None:
    assert check("chat", max_completion_tokens=7, max_tokens=9).max_tokens == 7
    assert check("chat", max_tokens=9).max_tokens == 9


def test_ensemble_inputs_greedy_at_temperature_zero_and_sampling_as_asked() -> None:
    greedy = check(temperature=0, top_p=0.5, seed=3, stop="\n", max_tokens=5)
    greedy.prompt = "hi"
    assert P.triton_inputs(greedy, "cpu-reference", stream=True) == {
        "text_input": "hi", "max_tokens": 5, "exclude_input_in_output": True, "stream": True, "top_k": 1,
        "seed": 3, "stop_words": ["\n"]}  # fmt: skip
    sampled = check(temperature=0.7, top_p=0.9)
    inputs = P.triton_inputs(sampled, "tensorrt-engine", stream=False)
    assert {k: inputs.get(k) for k in ("temperature", "top_p", "top_k", "stream")} == {
        "temperature": 0.7, "top_p": 0.9, "top_k": None, "stream": None}  # fmt: skip


def test_llmapi_inputs_are_its_sampling_params() -> None:
    gen = check(temperature=0.5, seed=1, stop=["x"], max_tokens=4)
    gen.prompt = "p"
    assert P.triton_inputs(gen, "pytorch", stream=True) == {
        "text_input": "p", "streaming": True, "sampling_param_max_tokens": 4,
        "sampling_param_exclude_input_from_output": True, "sampling_param_temperature": 0.5,
        "sampling_param_seed": 1, "sampling_param_stop": ["x"]}  # fmt: skip


@pytest.mark.parametrize(
    ("pieces", "stops", "sent", "hit"),
    [(["ab", "c"], [], "abc", False),
     (["Hel", "lo wor", "ld"], ["o w"], "Hell", True),
     (["a", "b", "<", "/", "s", ">", "x"], ["</s>"], "ab", True),
     (["a<", "/b"], ["</s>"], "a</b", False),  # held back while it could begin a stop, then released
     (["xEND"], ["END", "x"], "", True)],
)  # fmt: skip
def test_stop_sequences_cut_streamed_text_before_them(
    pieces: list[str], stops: list[str], sent: str, hit: bool
) -> None:
    s = P.Stops(stops)
    out = ""
    for piece in pieces:
        out += s.feed(piece)
        if s.hit:
            break
    out += s.flush()
    assert (out, s.hit) == (sent, hit)


def test_chat_content_parts_are_joined_and_other_parts_refused() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    messages = P.chat_messages({"messages": [{"role": "user", "content": parts}]})
    assert messages == [{"role": "user", "content": "ab"}]
    with pytest.raises(P.ApiError, match="only text parts"):
        P.chat_messages({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})


def test_malformed_json_is_a_400_that_says_so() -> None:
    with pytest.raises(P.ApiError, match="not valid JSON") as e:
        P.parse_json(b'{"model": ')
    assert e.value.body()["error"]["type"] == "invalid_request_error"
    with pytest.raises(P.ApiError, match="JSON object"):
        P.parse_json(b"[1]")
