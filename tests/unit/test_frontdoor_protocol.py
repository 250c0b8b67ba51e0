"""The front door's request checks and its translation to Triton's generate inputs (pure)."""

from __future__ import annotations

from typing import Any

import pytest
from llm_operator.frontdoor import protocol as P
from llm_operator.frontdoor import responses as R
from llm_operator.frontdoor import triton_inputs as T

LIMITS = P.Limits(max_input_len=100, max_seq_len=200)


def check(kind: str = "completion", backend: str = "tensorrt-engine", **body: Any) -> P.Generation:
    return P.check({"model": "m", **body}, kind, LIMITS, backend=backend)


def refused(kind: str = "completion", backend: str = "tensorrt-engine", **body: Any) -> P.ApiError:
    with pytest.raises(P.ApiError) as e:
        check(kind, backend, **body)
    return e.value


@pytest.mark.parametrize(
    ("body", "param"),
    [({"best_of": 2}, "best_of"), ({"echo": True}, "echo"),
     ({"suffix": "x"}, "suffix"), ({"logit_bias": {"1": 5}}, "logit_bias"),
     ({"functions": [{}]}, "functions"), ({"function_call": "auto"}, "function_call"),
     ({"skip_special_tokens": False}, "skip_special_tokens"), ({"stop_token_ids": [2]}, "stop_token_ids")],
)  # fmt: skip
def test_what_the_backend_cannot_honour_is_refused_by_name(body: dict[str, Any], param: str) -> None:
    e = refused(**body)
    assert (e.status, e.param, e.code) == (400, param, "unsupported_parameter")
    assert param in e.message and "remove" in e.message


@pytest.mark.parametrize("backend", ["tensorrt-engine", "cpu-reference", "pytorch"])
def test_decoding_and_stop_ids_say_why_no_backend_takes_them(backend: str) -> None:
    e = refused(backend=backend, stop_token_ids=[128009])
    assert e.param == "stop_token_ids" and "text in stop" in e.message
    e = refused(backend=backend, skip_special_tokens=False)
    assert e.param == "skip_special_tokens" and "per model, not per request" in e.message


def test_defaults_of_unsupported_parameters_pass_as_sdks_send_them() -> None:
    gen = check(
        n=1, best_of=1, logprobs=None, echo=False, presence_penalty=0, frequency_penalty=0.0, user="u",
        skip_special_tokens=True, stop_token_ids=[],
    )  # fmt: skip
    assert gen.max_tokens == 16  # OpenAI's default for completions


# What inference-perf, guidellm and Qwen3 users send (shared/reference/review-front-door.md D4).
CLIENT_KNOBS: dict[str, Any] = {"ignore_eos": True, "min_tokens": 8, "top_k": 20, "repetition_penalty": 1.1,
                "presence_penalty": 0.5, "frequency_penalty": -1}  # fmt: skip


@pytest.mark.parametrize("backend", ["tensorrt-engine", "cpu-reference"])
def test_the_engine_takes_every_knob_clients_send_as_its_own_inputs(backend: str) -> None:
    gen = check(backend=backend, temperature=0.8, **CLIENT_KNOBS)
    inputs = T.triton_inputs(gen, backend, stream=True, end_id=2)
    names = ("end_id", "pad_id", "min_tokens", "runtime_top_k", "repetition_penalty", "presence_penalty",
             "frequency_penalty")  # fmt: skip
    assert {k: inputs.get(k) for k in names} == {
        "end_id": -1, "pad_id": None, "min_tokens": 8, "runtime_top_k": 20, "repetition_penalty": 1.1,
        "presence_penalty": 0.5, "frequency_penalty": -1.0}  # fmt: skip


def test_neutral_knobs_send_nothing_to_the_engine() -> None:
    """inference-perf sends ignore_eos false on every request; vLLM's top_k -1 is no top-k."""
    gen = check(ignore_eos=False, min_tokens=0, top_k=-1, repetition_penalty=1.0, temperature=0.5)
    inputs = T.triton_inputs(gen, "tensorrt-engine", stream=False)
    assert not {"end_id", "min_tokens", "runtime_top_k", "repetition_penalty"} & set(inputs)
    assert "sampling_param_top_k" not in T.triton_inputs(check(backend="pytorch", top_k=0), "pytorch", False)


@pytest.mark.parametrize("param", ["ignore_eos", "min_tokens", "repetition_penalty"])
def test_what_the_llmapi_model_cannot_take_is_refused_by_name_for_pytorch(param: str) -> None:
    e = refused(backend="pytorch", **{param: CLIENT_KNOBS[param]})
    assert (e.status, e.param, e.code) == (400, param, "unsupported_parameter")
    assert "(pytorch)" in e.message
    gen = check(backend="pytorch", temperature=0.5, top_k=5, presence_penalty=0.5, ignore_eos=False)
    inputs = T.triton_inputs(gen, "pytorch", stream=False)
    assert (inputs["sampling_param_top_k"], inputs["sampling_param_presence_penalty"]) == (5, 0.5)


@pytest.mark.parametrize(
    ("body", "param"),
    [({"ignore_eos": "yes"}, "ignore_eos"), ({"top_k": -2}, "top_k"), ({"min_tokens": -1}, "min_tokens"),
     ({"repetition_penalty": 0}, "repetition_penalty"), ({"repetition_penalty": 3}, "repetition_penalty")],
)  # fmt: skip
def test_knobs_out_of_range_are_refused_with_the_field(body: dict[str, Any], param: str) -> None:
    assert refused(**body).param == param


def test_chat_template_kwargs_are_chats_and_cannot_replace_what_the_server_sets() -> None:
    gen = check("chat", messages=[], chat_template_kwargs={"enable_thinking": False})
    assert gen.template_kwargs == {"enable_thinking": False}
    assert refused("completion", chat_template_kwargs={"x": 1}).code == "unknown_parameter"
    e = refused("chat", messages=[], chat_template_kwargs={"bos_token": "<s>"})
    assert e.param == "chat_template_kwargs" and "bos_token" in e.message
    assert refused("chat", messages=[], chat_template_kwargs=[1]).param == "chat_template_kwargs"


def test_continuous_usage_stats_puts_the_counts_so_far_in_every_chunk() -> None:
    counts = R.usage(3, 1)
    plain = check(stream=True, stream_options={"include_usage": True})
    assert R.chunk(plain, "a", None, counts=counts)["usage"] is None
    every = check(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True})
    assert R.chunk(every, "a", None, counts=counts)["usage"] == counts


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


def test_engine_inputs_are_the_prompts_ids_greedy_at_temperature_zero_and_sampling_as_asked() -> None:
    """The tensorrt_llm model's own names; stop strings stay in the front door (Stops)."""
    greedy = check(temperature=0, top_p=0.5, seed=3, stop="\n", max_tokens=5)
    greedy.prompt, greedy.prompt_ids = "hi", [104, 105]
    assert T.triton_inputs(greedy, "cpu-reference", stream=True, end_id=7) == {
        "input_ids": [104, 105], "input_lengths": 2, "request_output_len": 5, "exclude_input_in_output": True,
        "streaming": True, "runtime_top_k": 1, "seed": 3, "end_id": 7, "pad_id": 7}  # fmt: skip
    sampled = check(temperature=0.7, top_p=0.9)
    inputs = T.triton_inputs(sampled, "tensorrt-engine", stream=False)
    names = ("temperature", "runtime_top_p", "runtime_top_k", "streaming", "end_id")
    want = {
        "temperature": 0.7,
        "runtime_top_p": 0.9,
        "runtime_top_k": None,
        "streaming": None,
        "end_id": None,
    }
    assert {k: inputs.get(k) for k in names} == want


def test_llmapi_inputs_are_its_sampling_params() -> None:
    gen = check(temperature=0.5, seed=1, stop=["x"], max_tokens=4)
    gen.prompt = "p"
    assert T.triton_inputs(gen, "pytorch", stream=True) == {
        "text_input": "p", "streaming": True, "sampling_param_max_tokens": 4,
        "sampling_param_exclude_input_from_output": True, "return_finish_reason": True,
        "sampling_param_temperature": 0.5, "sampling_param_top_p": 1.0,
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
    s = R.Stops(stops)
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
    assert messages == [{"role": "user", "content": "a\nb"}]  # one part a line, as vLLM joins them
    with pytest.raises(P.ApiError, match="only text parts"):
        P.chat_messages({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})


def test_malformed_json_is_a_400_that_says_so() -> None:
    with pytest.raises(P.ApiError, match="not valid JSON") as e:
        P.parse_json(b'{"model": ')
    assert e.value.body()["error"]["type"] == "invalid_request_error"
    with pytest.raises(P.ApiError, match="JSON object"):
        P.parse_json(b"[1]")
