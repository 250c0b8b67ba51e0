"""The front door's tools and tool_choice: checks and refusals (tools/request.py), the guides they
map to, the messages that carry calls back to a chat template (tools/messages.py, rendered as
transformers renders them), and answers with tool calls from a Triton stand-in, streamed and not,
read with the openai SDK's own types and its stream accumulator."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from llm_operator.frontdoor import protocol as P
from llm_operator.frontdoor import structured as S
from llm_operator.frontdoor import triton_inputs as T
from llm_operator.frontdoor.chat import render_chat
from llm_operator.frontdoor.protocol import Limits
from llm_operator.frontdoor.server import FrontDoor, Settings, serve
from llm_operator.frontdoor.tokenizer import Tokenizer
from llm_operator.frontdoor.tools import request as TR
from llm_operator.frontdoor.tools.messages import template_messages
from llm_operator.frontdoor.upstream import Upstream
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tests.unit.test_frontdoor_chat import transformers_render
from tests.unit.test_frontdoor_engine_ids import TEMPLATES, byte_level
from tests.unit.test_frontdoor_server import STREAM_HEAD, events, exchange, fake_triton, front_door, ids, sse

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
           "required": ["city"]}  # fmt: skip
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather now", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "get_time"}},
]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def extras(backend: str = "cpu-reference", parser: str = "", kind: str = "chat", **body: Any) -> P.Extras:
    return S.extras(body, kind, backend, parser)


def refused(backend: str = "cpu-reference", parser: str = "", kind: str = "chat", **body: Any) -> P.ApiError:
    with pytest.raises(P.ApiError) as e:
        extras(backend, parser, kind, **body)
    assert e.value.status == 400
    return e.value


def test_a_named_function_is_guided_by_its_parameters_and_its_text_is_the_arguments() -> None:
    got = extras(tools=TOOLS, tool_choice=NAMED)
    assert (got.guide_type, json.loads(got.guide), got.parser, got.tool) == ("json_schema", WEATHER, "named",
                                                                              "get_weather")  # fmt: skip
    inputs = T.triton_inputs(P.Generation("chat", "m", "", 8, extras=got), "cpu-reference", True)
    assert inputs["guided_decoding_guide"] == got.guide
    no_parameters = extras(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert json.loads(no_parameters.guide) == TR.NO_PARAMETERS


def test_required_is_an_array_of_calls_each_name_with_its_own_parameters() -> None:
    got = extras(tools=TOOLS, tool_choice="required")
    assert got.parser == "required" and got.tools == TOOLS
    schema = json.loads(got.guide)
    assert (schema["type"], schema["minItems"], "maxItems" in schema) == ("array", 1, False)
    branches = schema["items"]["anyOf"]
    assert [(b["properties"]["name"]["enum"], b["properties"]["parameters"]) for b in branches] == [
        (["get_weather"], WEATHER), (["get_time"], TR.NO_PARAMETERS)]  # fmt: skip
    assert all(b["required"] == ["name", "parameters"] for b in branches)
    one = json.loads(extras(tools=TOOLS[:1], tool_choice="required", parallel_tool_calls=False).guide)
    assert one["maxItems"] == 1 and one["items"]["properties"]["name"]["enum"] == ["get_weather"]


def test_auto_needs_the_deployments_parser_and_none_only_shows_the_template() -> None:
    assert extras(parser="hermes", tools=TOOLS) == P.Extras(tools=TOOLS, parser="hermes")
    assert extras(parser="mistral", tools=TOOLS, tool_choice="auto").parser == "mistral"
    for body, param in (
        ({"tools": TOOLS}, "tools"),
        ({"tools": TOOLS, "tool_choice": "auto"}, "tool_choice"),
    ):
        e = refused(**body)
        assert (e.param, e.code) == (
            param,
            "unsupported_parameter",
        ) and "spec.model.toolCallParser" in e.message
    assert extras(tools=TOOLS, tool_choice="none") == P.Extras(tools=TOOLS)
    assert extras(tools=[], tool_choice="none") == P.Extras()


def test_guided_choices_need_a_guided_decoder_auto_does_not() -> None:
    for choice in ("required", NAMED):
        for backend in ("tensorrt-engine", "pytorch"):
            assert extras(backend, tools=TOOLS, tool_choice=choice) == extras(tools=TOOLS, tool_choice=choice)
        # An engine without its tokenizer info serves without a guided decoder (runtime/launcher.py).
        with pytest.raises(P.ApiError) as e:
            S.extras({"tools": TOOLS, "tool_choice": choice}, "chat", "tensorrt-engine", "",
                     S.NO_TOKENIZER_INFO)  # fmt: skip
        assert (e.value.status, e.value.param, e.value.code) == (400, "tool_choice", "unsupported_parameter")
        assert "(tensorrt-engine): its engine has no xgrammar tokenizer info" in e.value.message
    assert extras("tensorrt-engine", "llama3-json", tools=TOOLS).parser == "llama3-json"


@pytest.mark.parametrize("unguided", ["", S.NO_TOKENIZER_INFO])
def test_the_gpu_engine_gets_a_named_choices_guide_unless_it_has_no_guided_decoder(
    tmp_path: Path, unguided: str
) -> None:
    """tensorrt-engine through the front door: the guide reaches `tensorrt_llm` beside the prompt's
    ids and the constrained text comes back as the call; without a guided decoder, a 400 and
    nothing sent to Triton."""
    seen: list[dict[str, Any]] = []

    async def engine(w: asyncio.StreamWriter) -> None:
        w.write(STREAM_HEAD + sse(ids('{"city": "Paris"}')) + b"0\r\n\r\n")
        await w.drain()

    async def ask() -> tuple[int, bytes]:
        async with front_door(
            engine, tmp_path, seen=seen, backend="tensorrt-engine", unguided=unguided
        ) as port:
            request = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20,
                       "tools": TOOLS, "tool_choice": NAMED}  # fmt: skip
            return await exchange(port, request, "/v1/chat/completions")

    status, raw = asyncio.run(ask())
    if unguided:
        assert status == 400 and b"no xgrammar tokenizer info" in raw and b'"tool_choice"' in raw
        assert seen == []
        return
    assert status == 200, raw
    (body,) = seen
    assert body["guided_decoding_guide_type"] == "json_schema"
    assert json.loads(body["guided_decoding_guide"]) == WEATHER
    assert body["input_ids"] and "text_input" not in body
    (call,) = answer(raw).choices[0].message.tool_calls or []
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("body", "param"),
    [({"tools": [{"type": "code_interpreter"}]}, "tools"),
     ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools"),
     ({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]}, "tools"),
     ({"tools": [TOOLS[0], TOOLS[0]]}, "tools"),
     ({"tools": [{"type": "function", "function": {"name": "f", "description": "x" * TR.MAX_TOOLS_BYTES}}]},
      "tools"),
     ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
     ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
     ({"tool_choice": "required"}, "tool_choice"),
     ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
     ({"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": "no"}, "parallel_tool_calls")],
)  # fmt: skip
def test_refusals_name_the_parameter(body: dict[str, Any], param: str) -> None:
    assert refused(**body).param == param


def test_parallel_calls_cannot_be_forbidden_to_a_parser_and_completions_have_no_tools() -> None:
    e = refused(parser="hermes", tools=TOOLS, parallel_tool_calls=False)
    assert (e.param, e.code) == ("parallel_tool_calls", "unsupported_parameter")
    e = refused(kind="completion", tools=TOOLS)
    assert (e.param, e.code) == ("tools", "unsupported_parameter")
    assert extras(kind="completion", tools=[], tool_choice="none") == P.Extras()
    P.check({"model": "m", "tools": TOOLS, "tool_choice": "auto", "parallel_tool_calls": True}, "chat",
            P.Limits(), backend="cpu-reference")  # fmt: skip


ROUND_TRIP = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "noon"},
]  # fmt: skip


def test_a_tool_round_trip_renders_as_transformers_renders_it() -> None:
    messages = template_messages(P.chat_messages({"messages": ROUND_TRIP}))
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    qwen = TEMPLATES["qwen2.5"]  # the Hermes family's: tools in the system turn, <tool_call> blocks
    ours = render_chat(qwen, messages, tools=TOOLS)
    assert ours == transformers_render(qwen, messages, "", "", tools=TOOLS, add_generation_prompt=True)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in ours
    assert "<tool_response>\n18 C\n</tool_response>\n<tool_response>\nnoon" in ours
    assert json.dumps(TOOLS[0], ensure_ascii=False) in ours


def test_messages_with_calls_that_cannot_be_rendered_are_refused() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}
    array = {**call, "function": {"name": "f", "arguments": "[1]"}}
    for messages in ([{"role": "assistant", "tool_calls": [call]}],
                     [{"role": "assistant", "tool_calls": [array]}],
                     [{"role": "user", "content": "x", "tool_calls": []}],
                     [{"role": "tool", "content": "18 C"}]):  # fmt: skip
        with pytest.raises(P.ApiError) as e:
            template_messages(P.chat_messages({"messages": messages}))
        assert e.value.param == "messages"


def speaks(text: str) -> Any:
    """A Triton stand-in whose engine writes `text` (cpu-reference ids: its bytes), 3 bytes a response."""

    async def behaviour(w: asyncio.StreamWriter) -> None:
        w.write(
            STREAM_HEAD + b"".join(sse(ids(text[i : i + 3])) for i in range(0, len(text), 3)) + b"0\r\n\r\n"
        )
        await w.drain()

    return behaviour


# Before the cpu-reference template: the tools' names, when it gets any.
TOOLS_PREFIX = "{% if tools %}TOOLS {{ tools | map(attribute='function.name') | join(',') }};{% endif %}"


def chat(text: str, tmp_path: Path, parser: str = "", **body: Any) -> tuple[int, bytes, list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    async def go() -> tuple[int, bytes]:
        async with front_door(speaks(text), tmp_path, seen=seen, tool_parser=parser,
                              template_prefix=TOOLS_PREFIX) as port:  # fmt: skip
            request = {
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 500,
                **body,
            }
            return await exchange(port, request, "/v1/chat/completions")

    status, raw = asyncio.run(go())
    return status, raw, seen


def answer(raw: bytes) -> ChatCompletion:
    return ChatCompletion.model_validate_json(raw.split(b"\r\n\r\n", 1)[1])


def streamed(raw: bytes) -> tuple[list[ChatCompletionChunk], ChatCompletion]:
    chunks = [ChatCompletionChunk.model_validate_json(e) for e in events(raw)[:-1]]
    state: ChatCompletionStreamState[None] = ChatCompletionStreamState(input_tools=TOOLS)  # type: ignore[arg-type]
    for chunk in chunks:
        state.handle_chunk(chunk)
    return chunks, state.get_final_completion()


HERMES = ('Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
          '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')  # fmt: skip


def test_auto_calls_streamed_and_whole_are_the_same_calls_in_openais_shapes(tmp_path: Path) -> None:
    status, raw, _ = chat(HERMES, tmp_path, "hermes", tools=TOOLS)
    assert status == 200
    whole = answer(raw).choices[0]
    assert (whole.finish_reason, whole.message.content) == ("tool_calls", "Checking.")
    calls = whole.message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [  # type: ignore[union-attr]
        ("get_weather", {"city": "Paris"}), ("get_time", {})]  # fmt: skip
    status, raw, _ = chat(HERMES, tmp_path, "hermes", tools=TOOLS, stream=True)
    chunks, final = streamed(raw)
    (choice,) = final.choices
    assert (choice.finish_reason, choice.message.content) == ("tool_calls", "Checking.")
    streamed_calls = choice.message.tool_calls or []
    assert [(c.function.name, c.function.arguments) for c in streamed_calls] == [  # type: ignore[union-attr]
        (c.function.name, c.function.arguments) for c in calls]  # type: ignore[union-attr]  # fmt: skip
    deltas = [d for c in chunks for d in c.choices[0].delta.tool_calls or []]
    starts = [d for d in deltas if d.id]
    assert [(d.index, d.type, d.function.name, d.function.arguments) for d in starts] == [  # type: ignore[union-attr]
        (0, "function", "get_weather", ""), (1, "function", "get_time", "")]  # fmt: skip
    fragments = [d for d in deltas if not d.id]
    assert len(fragments) > 2 and all(d.function and d.function.name is None for d in fragments)


def test_a_named_choice_is_guided_and_answers_with_that_call_finishing_stop(tmp_path: Path) -> None:
    status, raw, seen = chat('{"city": "Oslo"}', tmp_path, tools=TOOLS, tool_choice=NAMED)
    assert status == 200
    (request,) = [s for s in seen if "input_ids" in s]
    assert json.loads(request["guided_decoding_guide"]) == WEATHER
    whole = answer(raw).choices[0]
    assert (whole.finish_reason, whole.message.content) == ("stop", None)
    (call,) = whole.message.tool_calls or []
    assert (call.function.name, call.function.arguments) == ("get_weather", '{"city": "Oslo"}')  # type: ignore[union-attr]
    _, final = streamed(chat('{"city": "Oslo"}', tmp_path, tools=TOOLS, tool_choice=NAMED, stream=True)[1])
    (streamed_call,) = final.choices[0].message.tool_calls or []
    assert streamed_call.function.arguments == '{"city": "Oslo"}'  # type: ignore[union-attr]
    assert final.choices[0].finish_reason == "stop"


def test_required_answers_with_each_call_of_the_array(tmp_path: Path) -> None:
    text = '[{"name": "get_time", "parameters": {}}, {"name": "get_weather", "parameters": {"city": "Rome"}}]'
    for stream in (False, True):
        _, raw, _ = chat(text, tmp_path, tools=TOOLS, tool_choice="required", stream=stream, n=1)
        got = streamed(raw)[1] if stream else answer(raw)
        calls = got.choices[0].message.tool_calls or []
        assert [(c.function.name, c.function.arguments) for c in calls] == [  # type: ignore[union-attr]
            ("get_time", "{}"), ("get_weather", '{"city": "Rome"}')]  # fmt: skip
        assert got.choices[0].finish_reason == "tool_calls"


def test_text_without_a_call_is_the_answer_and_tools_reach_the_template(tmp_path: Path) -> None:
    text = "No tool <tool_call> needed."
    _, raw, seen = chat(text, tmp_path, "hermes", tools=TOOLS, stream=True)
    _, final = streamed(raw)
    assert (final.choices[0].message.content, final.choices[0].finish_reason) == (text, "stop")
    assert not final.choices[0].message.tool_calls
    _, raw, seen = chat(text, tmp_path, tools=TOOLS, tool_choice="none")
    assert answer(raw).choices[0].message.content == text
    prompt = bytes(next(s for s in seen if "input_ids" in s)["input_ids"]).decode()  # the byte tokenizer's
    assert prompt.startswith("TOOLS get_weather,get_time;<|im_start|>user")


def test_a_marker_that_is_a_special_token_is_kept_for_the_parser_and_only_for_it(tmp_path: Path) -> None:
    """Mistral's [TOOL_CALLS] is a special token, which decoding skips: kept as text when the
    deployment's parser is mistral and the request may call tools, skipped otherwise."""
    byte_level(tmp_path, ["</s>", "[TOOL_CALLS]"], None, "</s>")
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({**config, "chat_template": TEMPLATES["qwen2.5"]})
    )
    tokenizer = Tokenizer.load(tmp_path)
    marker = tokenizer.backend.token_to_id("[TOOL_CALLS]")
    said = '[{"name": "get_time", "arguments": {}}]'
    output = [marker, *tokenizer.encode(said, add_special_tokens=False)]

    async def engine(w: asyncio.StreamWriter) -> None:
        w.write(
            STREAM_HEAD
            + b"".join(sse({"output_ids": i, "sequence_length": 1}) for i in output)
            + b"0\r\n\r\n"
        )
        await w.drain()

    async def ask(parser: str, **body: Any) -> ChatCompletion:
        triton = await fake_triton(engine, [])
        upstream = Upstream("127.0.0.1", triton.sockets[0].getsockname()[1])
        settings = Settings(["m"], "tensorrt_llm", "tensorrt-engine", Limits(), tool_parser=parser)
        server = await serve(FrontDoor(settings, tokenizer, upstream), "127.0.0.1", 0)
        request = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100, **body}
        try:
            status, raw = await exchange(server.sockets[0].getsockname()[1], request, "/v1/chat/completions")
        finally:
            server.close()
            triton.close()
        assert status == 200, raw
        return answer(raw)

    called = asyncio.run(ask("mistral", tools=TOOLS)).choices[0]
    (call,) = called.message.tool_calls or []
    assert (called.finish_reason, call.function.name, len(call.id)) == ("tool_calls", "get_time", 9)  # type: ignore[union-attr]
    assert asyncio.run(ask("mistral")).choices[0].message.content == said, "no tools: skipped"
    assert asyncio.run(ask("mistral", tools=TOOLS, tool_choice="none")).choices[0].message.content == said


def test_each_of_n_choices_is_parsed_on_its_own(tmp_path: Path) -> None:
    """n = 2, the engine's responses interleaved: one choice calls tools, the other answers."""
    texts = [HERMES, "Just text, no call."]

    async def engine(w: asyncio.StreamWriter) -> None:
        steps = [(i, t[k : k + 4]) for k in range(0, max(map(len, texts)), 4) for i, t in enumerate(texts)]
        body = b"".join(sse({**ids(piece), "sequence_index": i}) for i, piece in steps if piece)
        w.write(STREAM_HEAD + body + b"0\r\n\r\n")
        await w.drain()

    async def ask(stream: bool) -> tuple[int, bytes]:
        async with front_door(engine, tmp_path, tool_parser="hermes") as port:
            request = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 500,
                       "tools": TOOLS, "n": 2, "stream": stream}  # fmt: skip
            return await exchange(port, request, "/v1/chat/completions")

    whole = answer(asyncio.run(ask(False))[1])
    _, streamed_answer = streamed(asyncio.run(ask(True))[1])
    for got in (whole, streamed_answer):
        first, second = sorted(got.choices, key=lambda c: c.index)
        assert (first.finish_reason, first.message.content, len(first.message.tool_calls or [])) == (
            "tool_calls", "Checking.", 2)  # fmt: skip
        assert (second.finish_reason, second.message.content, second.message.tool_calls) == (
            "stop", texts[1], None)  # fmt: skip


@pytest.mark.parametrize("stream", [True, False])
def test_the_llm_api_contracts_text_so_far_is_parsed_once(tmp_path: Path, stream: bool) -> None:
    """pytorch: the llmapi model sends each sequence's whole text so far; the parser reads each new
    part once, so the calls are the engine contract's."""

    async def engine(w: asyncio.StreamWriter) -> None:
        body = b"".join(sse({"text_output": HERMES[:k]}) for k in range(5, len(HERMES) + 5, 5))
        w.write(STREAM_HEAD + body + b"0\r\n\r\n")
        await w.drain()

    async def ask() -> tuple[int, bytes]:
        async with front_door(engine, tmp_path, backend="pytorch", tool_parser="hermes") as port:
            request = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 500,
                       "tools": TOOLS, "stream": stream}  # fmt: skip
            return await exchange(port, request, "/v1/chat/completions")

    status, raw = asyncio.run(ask())
    assert status == 200, raw
    got = streamed(raw)[1] if stream else answer(raw)
    calls = got.choices[0].message.tool_calls or []
    assert [(c.function.name, c.function.arguments) for c in calls] == [  # type: ignore[union-attr]
        ("get_weather", '{"city": "Paris"}'), ("get_time", "{}")]  # fmt: skip
    assert (got.choices[0].message.content, got.choices[0].finish_reason) == ("Checking.", "tool_calls")
