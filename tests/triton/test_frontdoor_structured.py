"""Structured outputs, log probabilities and n through a real pod's processes (the front door and
Triton's python backend, as test_frontdoor.py runs them) on the engine contract, asked with the
official openai SDK: `chat.completions.parse` with a pydantic model returns a valid object,
streamed and not; n choices are each the single request with seed + i; log-probability entries
spell the text they come with; usage sums the choices; tool_choice named and required answer with
tool calls whose arguments validate. Each test runs on both contracts: the
engine contract's inputs, and the LLM API contract's (the operator's wrapper's names, which the
CPU llmapi model reads: runtime/llmapi_structured.py)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Literal

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from pydantic import BaseModel, Field

from tests.e2e import openai_sdk
from tests.triton.leader import leader_pod
from tests.triton.test_cpu_llmapi import llmapi_spec
from tests.triton.test_frontdoor import NAMES, TIMEOUT, spec

pytestmark = pytest.mark.triton

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Is it raining? Answer in JSON."}]


class Weather(BaseModel):
    """Bounded values only: the random tiny model reaches the grammar's end on every path."""

    answer: Literal["yes", "no"]
    sure: bool
    percent: int = Field(ge=0, le=99)
    note: str = Field(max_length=5)


@pytest.fixture(scope="module", params=["engine", "llmapi"])
def client(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[openai.OpenAI]:
    deployment = spec() if request.param == "engine" else llmapi_spec(spec())
    try:
        with leader_pod(tmp_path_factory.mktemp("structured"), deployment, NAMES) as pod:
            yield openai.OpenAI(base_url=pod.base_url, api_key="unused", timeout=TIMEOUT, max_retries=0)
    except RuntimeError as e:
        pytest.fail(str(e))


def test_parse_returns_a_valid_object_whole_and_streamed(client: openai.OpenAI) -> None:
    for seed in range(3):
        done = client.chat.completions.parse(model="tiny", messages=MESSAGES, response_format=Weather,
                                             seed=seed, max_tokens=120)  # fmt: skip
        choice = done.choices[0]
        assert isinstance(choice.message.parsed, Weather) and choice.finish_reason == "stop", choice
        with client.chat.completions.stream(model="tiny", messages=MESSAGES, response_format=Weather,
                                            seed=seed, max_tokens=120) as stream:  # fmt: skip
            streamed = stream.get_final_completion().choices[0]
        assert streamed.message.parsed == choice.message.parsed and streamed.finish_reason == "stop"


def test_tool_choice_named_and_required_call_tools_whose_arguments_validate(client: openai.OpenAI) -> None:
    for seed in range(3):
        openai_sdk.calls_tools_as_told(client, "tiny", max_tokens=190, seed=seed)


def test_n_choices_are_single_requests_with_seed_plus_i_and_their_logprobs_spell_them(
    client: openai.OpenAI,
) -> None:
    asked = {"model": "tiny", "messages": MESSAGES, "max_tokens": 12, "temperature": 1.0, "seed": 40}
    done = client.chat.completions.create(**asked, n=3, logprobs=True)  # type: ignore[call-overload]
    assert [c.index for c in done.choices] == [0, 1, 2]
    for choice in done.choices:
        alone = client.chat.completions.create(**{**asked, "seed": 40 + choice.index})
        assert choice.message.content == alone.choices[0].message.content
        entries = choice.logprobs.content
        assert "".join(e.token for e in entries) == choice.message.content  # the tiny model: a byte a token
        assert all(e.logprob < 0 and e.top_logprobs == [] for e in entries)
    assert len({c.message.content for c in done.choices}) == 3
    assert done.usage is not None and done.usage.completion_tokens == 3 * 12
    # Streamed: chunks of the three interleave, each choice's text and entries as whole.
    texts: dict[int, str] = defaultdict(str)
    tokens: dict[int, str] = defaultdict(str)
    for chunk in client.chat.completions.create(**asked, n=3, logprobs=True, stream=True):  # type: ignore[call-overload]
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            tokens[c.index] += "".join(e.token for e in (c.logprobs.content if c.logprobs else []))
    assert (
        [texts[i] for i in range(3)]
        == [c.message.content for c in done.choices]
        == [tokens[i] for i in range(3)]
    )


def test_completions_take_logprobs_0_and_refuse_alternatives(client: openai.OpenAI) -> None:
    done = client.completions.create(model="tiny", prompt="Once", max_tokens=5, logprobs=0, temperature=0)
    logprobs = done.choices[0].logprobs
    assert logprobs is not None and "".join(logprobs.tokens or []) == done.choices[0].text
    assert logprobs.text_offset == [0, 1, 2, 3, 4]
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model="tiny", messages=MESSAGES, logprobs=True, top_logprobs=2)
