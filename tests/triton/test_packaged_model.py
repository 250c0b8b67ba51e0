"""The packaged SmolLM2-135M-Instruct on a real pod's processes (Triton's python backend and the
front door, as tests/triton/test_frontdoor.py runs them), asked through the official openai SDK: on
either contract it answers in words, ends on its own end token and streams the same text it answers
whole; on the engine contract it takes the benchmark clients' ignore_eos and min_tokens for real
(the pytorch contract refuses them, as upstream's llmapi model has no input for them:
docs/serving-api.md)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest
from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.runtime.cpu_reference import gguf_files
from openai.types.chat import ChatCompletionMessageParam
from pydantic import BaseModel, Field

from tests.triton.leader import leader_pod

pytestmark = pytest.mark.triton

NAME = "smollm2-135m-instruct"
QUESTION: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is the capital of France?"}]
MAX_TOKENS = 16  # the answer ends on its end token after 8; ignore_eos runs on to 16


# The default contract (the llmapi model) and the engine contract (token ids, the ensemble beside).
CONTRACTS = ("pytorch", "tensorrt-engine")


def spec(contract: str) -> LLMDeploymentSpec:
    return LLMDeploymentSpec.model_validate(
        {
            "model": {"name": "smollm2", "source": {"uri": f"builtin://{NAME}"}},
            "engine": {"backend": "cpu-reference", "maxBatchSize": 4, "maxInputLen": 256, "maxSeqLen": 512,
                       "maxNumTokens": 512, "cpuReference": {"contract": contract}},
            "runtime": {"streaming": True},
        }
    )  # fmt: skip


@pytest.fixture(scope="module")
def clients(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], openai.OpenAI]]:
    """contract -> a client of a pod on it, started on first use, each once per module."""
    cache = Path(os.environ.get("LLMOP_CACHE", "~/.cache/llm-operator")).expanduser() / "models"
    model_dir = tmp_path_factory.mktemp("smollm2")
    gguf_files.write(NAME, model_dir, cache)
    started: dict[str, openai.OpenAI] = {}
    try:
        with contextlib.ExitStack() as pods:

            def get(contract: str) -> openai.OpenAI:
                if contract not in started:
                    work = tmp_path_factory.mktemp(f"pod-{contract}")
                    try:
                        pod = pods.enter_context(leader_pod(work, spec(contract), ("smollm2",), model_dir))
                    except RuntimeError as e:  # it did not become ready
                        pytest.fail(str(e))
                    started[contract] = openai.OpenAI(base_url=pod.base_url, api_key="unused", timeout=120,
                                                      max_retries=0)  # fmt: skip
                return started[contract]

            yield get
    except RuntimeError as e:  # a pod did not stop cleanly
        pytest.fail(str(e))


def ask(client: openai.OpenAI, **extra: object) -> tuple[str, str | None]:
    done = client.chat.completions.create(
        model="smollm2", messages=QUESTION, max_tokens=MAX_TOKENS, temperature=0, extra_body=extra or None
    )
    return done.choices[0].message.content or "", done.choices[0].finish_reason


@pytest.mark.parametrize("contract", CONTRACTS)
def test_it_answers_in_words_and_stops_on_its_end_token(
    clients: Callable[[str], openai.OpenAI], contract: str
) -> None:
    text, finish = ask(clients(contract))
    assert "Paris" in text
    assert finish == "stop"


@pytest.mark.parametrize("contract", CONTRACTS)
def test_the_streamed_answer_is_the_whole_answer(
    clients: Callable[[str], openai.OpenAI], contract: str
) -> None:
    client = clients(contract)
    stream = client.chat.completions.create(
        model="smollm2", messages=QUESTION, max_tokens=MAX_TOKENS, temperature=0, stream=True
    )
    parts = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(parts) == ask(client)[0]
    assert all("\ufffd" not in p for p in parts)


def test_ignore_eos_and_min_tokens_run_past_the_natural_end(clients: Callable[[str], openai.OpenAI]) -> None:
    """On the engine contract: end_id -1 and min_tokens (docs/serving-api.md)."""
    client = clients("tensorrt-engine")
    natural, _ = ask(client)
    for knob in ({"ignore_eos": True}, {"min_tokens": MAX_TOKENS}):
        longer, _ = ask(client, **knob)
        assert longer.startswith(natural) and len(longer) > len(natural), knob


class Capital(BaseModel):
    city: str = Field(max_length=24)
    country: str = Field(max_length=24)


@pytest.mark.parametrize("contract", CONTRACTS)
def test_parse_ends_on_the_end_token(clients: Callable[[str], openai.OpenAI], contract: str) -> None:
    """Guided by the model's own tokenizer.json (its byte-level vocabulary, its end token allowed
    once the object is complete): a valid object, whole and streamed, finish_reason stop, on the
    engine contract's inputs and on the LLM API contract's (the operator's wrapper's)."""
    client = clients(contract)
    asked = {
        "model": "smollm2",
        "messages": QUESTION,
        "response_format": Capital,
        "temperature": 0,
        "max_tokens": 60,
    }
    done = client.chat.completions.parse(**asked)  # type: ignore[arg-type]
    assert isinstance(done.choices[0].message.parsed, Capital) and done.choices[0].finish_reason == "stop"
    with client.chat.completions.stream(**asked) as stream:
        streamed = stream.get_final_completion().choices[0]
    assert streamed.message.parsed == done.choices[0].message.parsed
