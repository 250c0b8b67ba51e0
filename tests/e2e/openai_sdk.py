"""What the official `openai` SDK must get from a deployment's OpenAI API (sync, async, streaming,
`parse`, tools),
asked by the e2e modules that run a real cpu-reference deployment (test_real_pods.py). Each check
takes a base URL this machine can reach (e2e.chat.base_url) and the names the deployment serves.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

# Any: the SDK types messages as its own TypedDicts.
MESSAGES: Any = [{"role": "user", "content": "Once upon a time"}]
MAX_TOKENS = 12


def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=60)


def lists_the_served_names(base: str, names: list[str]) -> None:
    assert [m.id for m in client(base).models.list()] == names


def chat_with_usage(base: str, model: str) -> str:
    """A greedy chat completion, its usage counted; returns its text."""
    done = client(base).chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    (choice,) = done.choices
    assert done.model == model and done.object == "chat.completion"
    assert choice.message.role == "assistant" and choice.message.content
    assert done.usage is not None and done.usage.prompt_tokens > 0
    assert done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens
    assert choice.finish_reason in ("stop", "length")
    if choice.finish_reason == "length":
        assert done.usage.completion_tokens == MAX_TOKENS
    else:
        assert 0 < done.usage.completion_tokens < MAX_TOKENS
    return str(choice.message.content)


def streams_the_same_text(base: str, model: str, text: str) -> None:
    """Streamed, greedy: the same text in several chunks, usage in a last chunk without choices
    (stream_options.include_usage), the SDK reading the stream to its end ([DONE])."""
    stream = client(base).chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    deltas = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(deltas) == text and sum(1 for d in deltas if d) > 1, deltas
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens > 0


def answers_concurrent_async_completions(base: str, model: str) -> None:
    async def both() -> list[openai.types.Completion]:
        async with openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=0, timeout=60) as c:
            return list(await asyncio.gather(*(
                c.completions.create(model=model, prompt=p, max_tokens=MAX_TOKENS, temperature=0)
                for p in ("Hello", "The sea")
            )))  # fmt: skip

    for done in asyncio.run(both()):
        assert done.object == "text_completion" and done.choices[0].text
        assert done.usage is not None and done.usage.completion_tokens > 0


def refuses_an_unknown_model_in_openais_words(base: str) -> None:
    with pytest.raises(openai.NotFoundError) as refused:
        client(base).chat.completions.create(model="no-such-model", messages=MESSAGES, max_tokens=4)
    error = refused.value.response.json()["error"]
    assert refused.value.status_code == 404 and set(error) >= {"message", "type", "param", "code"}, error
    assert error["message"], "says what to change"


def speaks_openai(base: str, name: str, alias: str) -> None:
    """Every check above against one deployment serving `name` under `alias` too: the same
    proof whichever way the request reaches a pod (the client Service, the router)."""
    lists_the_served_names(base, [name, alias])
    text = chat_with_usage(base, alias)
    streams_the_same_text(base, name, text)
    answers_concurrent_async_completions(base, alias)
    refuses_an_unknown_model_in_openais_words(base)


# Bounded values only: the random tiny model reaches the guide's end on every path.
FORECAST = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"},
                                             "percent": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["answer", "sure", "percent"], "additionalProperties": False}  # fmt: skip
CLOCK = {"type": "object", "properties": {"zone": {"enum": ["utc", "local"]}}, "required": ["zone"],
         "additionalProperties": False}  # fmt: skip
TOOLS: Any = [{"type": "function", "function": {"name": "forecast", "parameters": FORECAST}},
              {"type": "function", "function": {"name": "clock", "parameters": CLOCK}}]  # fmt: skip
SCHEMAS = {"forecast": FORECAST, "clock": CLOCK}


def calls_tools_as_told(c: openai.OpenAI, model: str, max_tokens: int, seed: int = 3) -> None:
    """tool_choice named and required (guided): tool calls whose arguments validate against their
    function's parameters, the same calls streamed (the SDK's stream accumulator) and not."""
    question: Any = [{"role": "user", "content": "Rain?"}]
    named: Any = {"type": "function", "function": {"name": "forecast"}}
    for choice, finish in ((named, "stop"), ("required", "tool_calls")):
        ask: Any = {"model": model, "messages": question, "tools": TOOLS, "tool_choice": choice, "seed": seed,
                    "max_tokens": max_tokens}  # fmt: skip
        whole = c.chat.completions.create(**ask).choices[0]
        assert whole.finish_reason == finish and whole.message.tool_calls, whole
        calls = [(t.function.name, t.function.arguments) for t in whole.message.tool_calls]
        for name, arguments in calls:
            jsonschema.validate(json.loads(arguments), SCHEMAS[name])
        if choice is named:
            assert [name for name, _ in calls] == ["forecast"] and whole.message.content is None
        with c.chat.completions.stream(**ask) as stream:
            streamed = stream.get_final_completion().choices[0]
        assert [(t.function.name, t.function.arguments) for t in streamed.message.tool_calls or []] == calls
        assert streamed.finish_reason == finish


class Weather(BaseModel):
    """Bounded values only: the random tiny model reaches the grammar's end on every path."""

    answer: Literal["yes", "no"]
    sure: bool
    percent: int = Field(ge=0, le=99)


def parses_and_calls_tools(c: openai.OpenAI, model: str) -> None:
    """`chat.completions.parse` with a pydantic model gets a valid object (response_format through
    guided decoding), then calls_tools_as_told."""
    question: Any = [{"role": "user", "content": "Is it raining? Answer in JSON."}]
    parsed = c.chat.completions.parse(model=model, messages=question, response_format=Weather, seed=3,
                                      max_tokens=80)  # fmt: skip
    assert isinstance(parsed.choices[0].message.parsed, Weather), parsed.choices[0]
    assert parsed.choices[0].finish_reason == "stop"
    calls_tools_as_told(c, model, max_tokens=300)
