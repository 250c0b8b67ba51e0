"""The OpenAI front door on a real pod's processes: the launcher starts the CPU runtime's tritonserver
and the front door beside it, as in a leader pod, and the official `openai` SDK (sync, async,
streaming) talks to it. Answers are checked against the same model run in this process, token
counts against the model's tokenizer, refusals against OpenAI's error format, and cancellation
against the tokens the model really decoded (its nv_llm_output_token_len counter)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.frontdoor.chat import render_chat
from llm_operator.frontdoor.upstream import SPARE_IDLE_S
from llm_operator.runtime.cpu_reference import tokenizer_files
from llm_operator.runtime.cpu_reference.tiny_lm import Penalties, Sampler, encode

from e2e.cluster.processes import free_port
from tests.triton.conftest import cpu_spec, expected
from tests.triton.leader import LeaderPod, leader_pod
from tests.triton.server import TritonProcess

pytestmark = pytest.mark.triton

NAMES = ("llm-operator/tiny-llama", "tiny")
MAX_INPUT_LEN, MAX_SEQ_LEN = 128, 256
TIMEOUT = 60.0


def spec() -> LLMDeploymentSpec:
    doc = cpu_spec(streaming=True).model_dump(by_alias=True, exclude_none=True)
    doc["engine"].update(maxInputLen=MAX_INPUT_LEN, maxSeqLen=MAX_SEQ_LEN)
    return LLMDeploymentSpec.model_validate(doc)


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LeaderPod]:
    try:
        with leader_pod(tmp_path_factory.mktemp("frontdoor"), spec(), NAMES) as pod:
            yield pod
    except RuntimeError as e:
        pytest.fail(str(e))


@pytest.fixture
def client(leader: LeaderPod) -> openai.OpenAI:
    return openai.OpenAI(base_url=leader.base_url, api_key="unused", timeout=TIMEOUT, max_retries=0)


def chat_prompt(pod: LeaderPod, messages: list[dict[str, Any]]) -> str:
    assert pod.tokenizer.chat_template
    return render_chat(pod.tokenizer.chat_template, messages)


def test_models_lists_the_deployments_name_and_alias(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == list(NAMES)
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_completion_is_the_models_text_with_usage_and_finish_length(
    leader: LeaderPod, client: openai.OpenAI
) -> None:
    r = client.completions.create(model=NAMES[0], prompt="Once upon a time", max_tokens=12, temperature=0)
    assert r.choices[0].text == expected("Once upon a time", 12)
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None
    prompt_tokens = leader.tokenizer.count("Once upon a time")
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (
        prompt_tokens, 12, prompt_tokens + 12)  # fmt: skip
    assert r.model == NAMES[0]


def v2(leader: LeaderPod, path: str, body: dict[str, Any]) -> str:
    """The ensemble's text_output through Triton's generate API (/v2 clients), all events joined."""
    url = f"http://127.0.0.1:{leader.http_port}/v2/models/ensemble/{path}"
    with urllib.request.urlopen(urllib.request.Request(url, json.dumps(body).encode()), timeout=60) as r:
        raw = r.read().decode()
    if path == "generate":
        return str(json.loads(raw)["text_output"])
    return "".join(
        json.loads(line[5:]).get("text_output", "") for line in raw.splitlines() if line.startswith("data:")
    )


def settled_tokens(leader: LeaderPod) -> float:
    """The decoder's token count once earlier requests are counted (each when its batch ends)."""
    last = leader.output_tokens()
    for _ in range(50):
        time.sleep(0.1)
        if (now := leader.output_tokens()) == last:
            return now
        last = now
    return last


def test_v2_clients_of_the_ensemble_get_the_front_doors_text_from_the_one_decoder(
    leader: LeaderPod, client: openai.OpenAI
) -> None:
    """The ensemble calls the front door's tensorrt_llm: the same text whole and streamed, and
    the decoder's token count moves by the ensemble's tokens too."""
    prompt, tokens = "Once upon a time", 12
    answer = client.completions.create(model=NAMES[0], prompt=prompt, max_tokens=tokens, temperature=0)
    before = settled_tokens(leader)
    body = {"text_input": prompt, "max_tokens": tokens}
    whole, streamed = v2(leader, "generate", body), v2(leader, "generate_stream", {**body, "stream": True})
    assert whole == streamed == answer.choices[0].text
    deadline = time.monotonic() + 10  # counted once each request's batch ends, after its answer
    while leader.output_tokens() - before < 2 * tokens and time.monotonic() < deadline:
        time.sleep(0.05)
    assert leader.output_tokens() - before == 2 * tokens


def test_chat_completion_renders_the_models_chat_template(leader: LeaderPod, client: openai.OpenAI) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]
    asked: Any = messages
    r = client.chat.completions.create(model="tiny", messages=asked, max_completion_tokens=10, temperature=0)
    prompt = chat_prompt(leader, messages)
    assert r.choices[0].message.content == expected(prompt, 10)
    assert r.choices[0].message.role == "assistant"
    assert r.usage is not None and r.usage.prompt_tokens == leader.tokenizer.count(prompt)


def test_streaming_chat_sends_each_token_and_usage_last(leader: LeaderPod, client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Tell me a story"}]
    stream = client.chat.completions.create(model=NAMES[0], messages=messages, max_tokens=20, stream=True,  # type: ignore[call-overload]
                                            temperature=0,
                                            stream_options={"include_usage": True})  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected(chat_prompt(leader, messages), 20)
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) == 20  # one per token
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 20


def test_stop_sequences_end_the_text_before_them(client: openai.OpenAI) -> None:
    full = expected("The sky is", 40)
    stop = full[10:12]
    want = full[: full.index(stop)]
    r = client.completions.create(
        model=NAMES[0], prompt="The sky is", max_tokens=40, stop=[stop, "\x00never"], temperature=0
    )
    assert (r.choices[0].text, r.choices[0].finish_reason) == (want, "stop")
    streamed = list(client.completions.create(model=NAMES[0], prompt="The sky is", max_tokens=40, stop=stop,
                                              temperature=0, stream=True))  # fmt: skip
    assert "".join(c.choices[0].text for c in streamed) == want
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_seeded_sampling_is_reproducible_and_differs_from_greedy(client: openai.OpenAI) -> None:
    def sample(seed: int) -> str:
        r = client.completions.create(model=NAMES[0], prompt="Hello", max_tokens=16, temperature=0.9,
                                      top_p=0.95, seed=seed)  # fmt: skip
        return r.choices[0].text

    assert sample(7) == sample(7)
    assert {sample(7), sample(8)} != {expected("Hello", 16)}


def test_an_omitted_temperature_samples_at_1_and_a_seed_makes_it_reproducible(client: openai.OpenAI) -> None:
    """OpenAI's default, not greedy: the model samples its whole distribution at temperature 1
    (top_p 1), the text of a seed is the text the same sampler draws alone, and a request without
    a seed gets a new one each time."""

    def sample(seed: int | None = None) -> str:
        r = client.completions.create(model=NAMES[0], prompt="Hello", max_tokens=16, seed=seed)
        return r.choices[0].text

    drawn = expected("Hello", 16, Sampler(temperature=1.0, top_p=1.0, seed=7))
    assert sample(seed=7) == drawn != expected("Hello", 16)
    assert len({sample(), sample(), sample()}) > 1


def test_benchmark_clients_knobs_reach_the_model(leader: LeaderPod, client: openai.OpenAI) -> None:
    """What inference-perf and guidellm send (ignore_eos, min_tokens) is served, and the penalties
    and top_k clients add change the text exactly as the model's sampler applies them."""
    knobs = {"ignore_eos": True, "min_tokens": 12, "top_k": 1, "repetition_penalty": 1.8,
             "presence_penalty": 1.5}  # fmt: skip
    r = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=24, extra_body=knobs)
    fp32 = Penalties(repetition=float(np.float32(1.8)), presence=float(np.float32(1.5)))  # the FP32 inputs
    sampler = Sampler(top_k=1, penalties=fp32, prompt=tuple(encode("Once upon a time")))
    assert r.choices[0].text == expected("Once upon a time", 24, sampler) != expected("Once upon a time", 24)
    assert r.usage is not None and r.usage.completion_tokens == 24
    every = {"include_usage": True, "continuous_usage_stats": True}  # guidellm's
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=6, stream=True,
        extra_body={"ignore_eos": False, "top_k": -1, "stream_options": every},
    )  # fmt: skip
    counts = [
        c.usage.completion_tokens for c in stream if c.choices and c.choices[0].delta.content and c.usage
    ]
    assert counts == list(range(1, 7))


def test_the_async_client_gets_concurrent_answers(leader: LeaderPod) -> None:
    async def run() -> list[str]:
        async with openai.AsyncOpenAI(base_url=leader.base_url, api_key="unused", timeout=TIMEOUT,
                                      max_retries=0) as c:  # fmt: skip
            replies = await asyncio.gather(*(
                c.completions.create(model="tiny", prompt=f"Question {i}:", max_tokens=8, temperature=0)
                for i in range(4)
            ))  # fmt: skip
            hi: Any = [{"role": "user", "content": "Hi"}]
            stream = await c.chat.completions.create(model="tiny", messages=hi, max_tokens=5, stream=True,
                                                     temperature=0)  # fmt: skip
            streamed = "".join([ch.choices[0].delta.content or "" async for ch in stream])
            return [r.choices[0].text for r in replies] + [streamed]

    out = asyncio.run(run())
    assert out[:4] == [expected(f"Question {i}:", 8) for i in range(4)]
    assert out[4] == expected(chat_prompt(leader, [{"role": "user", "content": "Hi"}]), 5)


def post(pod: LeaderPod, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(f"{pod.base_url}{path}", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


LONG = "x" * (MAX_INPUT_LEN + 1)


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "code"),
    [("/completions", b'{"model": "tiny", "prompt": ', 400, None, None),
     ("/completions", b'{"model": "gpt-4o", "prompt": "hi"}', 404, "model", "model_not_found"),
     ("/completions", json.dumps({"model": "tiny", "prompt": LONG}).encode(), 400, "prompt",
      "context_length_exceeded"),
     ("/completions", b'{"model": "tiny", "prompt": "hi", "max_tokens": 100000}', 400, "max_tokens", None),
     ("/completions", b'{"model": "tiny", "prompt": "hi", "max_tokens": 255}', 400, "max_tokens",
      "context_length_exceeded"),
     ("/completions", b'{"model": "tiny", "prompt": "hi", "n": 9}', 400, "n", None),
     ("/completions", b'{"model": "tiny", "prompt": "hi", "logprobs": 3}', 400, "logprobs",
      "unsupported_parameter"),
     ("/completions", b'{"model": "tiny", "prompt": "hi", "repetition_penalty": 0}', 400,
      "repetition_penalty", None),
     ("/chat/completions", b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "tools": '
      b'[{"type": "function", "function": {"name": "f"}}]}', 400, "tools", "unsupported_parameter"),
     ("/chat/completions", b'{"model": "tiny", "messages": []}', 400, "messages", None),
     ("/chat/completions", b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "top_p": 3}',
      400, "top_p", None)],
    ids=["malformed-json", "unknown-model", "prompt-too-long", "max-tokens-beyond-max-seq-len",
         "prompt-plus-max-tokens-too-long", "n", "logprobs", "repetition-penalty-zero", "tools",
         "no-messages", "top-p-out-of-range"],
)  # fmt: skip
def test_bad_requests_get_a_4xx_in_openais_format(
    leader: LeaderPod, path: str, body: bytes, status: int, param: str | None, code: str | None
) -> None:
    got, answer = post(leader, path, body)
    assert got == status, answer
    error = answer["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["message"]
    assert (error["param"], error["code"]) == (param, code), error


def test_the_sdk_raises_a_bad_request_for_an_unsupported_parameter(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="best_of"):
        client.completions.create(model="tiny", prompt="hi", best_of=3)


def test_a_client_that_disconnects_cancels_its_generation_in_triton(
    leader: LeaderPod, client: openai.OpenAI
) -> None:
    before = leader.output_tokens()
    stream = client.completions.create(model="tiny", prompt="A long tale:", max_tokens=240, stream=True)
    for _, _chunk in zip(range(3), stream, strict=False):
        pass
    stream.close()  # the SDK closes the connection
    deadline = time.monotonic() + 20
    while leader.output_tokens() == before and time.monotonic() < deadline:  # the model ends the request
        time.sleep(0.1)
    decoded = leader.output_tokens() - before
    assert 0 < decoded < 200, f"the model decoded {decoded} tokens of 240 after the client left"
    # ... and the server goes on serving.
    again = client.completions.create(model="tiny", prompt="hi", max_tokens=3, temperature=0)
    assert again.choices[0].text == expected("hi", 3)


def test_a_deployment_that_does_not_stream_answers_whole_and_refuses_stream(
    batch_server: TritonProcess, tmp_path: Path
) -> None:
    """runtime.streaming: false renders a model that is not decoupled: Triton's generate, not
    generate_stream, and a stream request (or n > 1: one answer per request) is refused with the
    field to change."""
    tokenizer_files.write(tmp_path)
    port = free_port()
    env = {**os.environ, "LLMOP_BACKEND": "cpu-reference", "LLMOP_SERVED_MODEL_NAMES": "tiny",
           "LLMOP_TOKENIZER_DIR": str(tmp_path), "LLMOP_OPENAI_PORT": str(port),
           "LLMOP_HTTP_PORT": str(batch_server.http_port)}  # fmt: skip
    door = subprocess.Popen([sys.executable, "-m", "llm_operator.frontdoor"], env=env)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                assert door.poll() is None and time.monotonic() < deadline, "the front door did not start"
                time.sleep(0.1)
        r = client.completions.create(model="tiny", prompt="Once", max_tokens=9, temperature=0)
        assert (r.choices[0].text, r.choices[0].finish_reason) == (expected("Once", 9), "length")
        with pytest.raises(openai.BadRequestError, match=r"runtime\.streaming") as e:
            client.completions.create(model="tiny", prompt="Once", max_tokens=9, stream=True)
        assert e.value.param == "stream"
        with pytest.raises(openai.BadRequestError, match=r"runtime\.streaming") as e:
            client.completions.create(model="tiny", prompt="Once", max_tokens=9, n=2)
        assert e.value.param == "n"
    finally:
        door.terminate()
        assert door.wait(timeout=10) == 0


def test_a_stop_after_openai_traffic_waits_on_no_idle_connection_nor_logs_a_traceback(tmp_path: Path) -> None:
    """Triton's stop waits, up to its exit timeout (5 s here), for every open HTTP connection: the
    front door's spare connection to it is closed once no request took it, so a pod that served
    the OpenAI API stops at once (a preStop drain has let SPARE_IDLE_S pass). The SDK's kept-alive
    connection to the front door ends quietly."""
    with leader_pod(tmp_path, spec(), NAMES) as pod:
        client = openai.OpenAI(base_url=pod.base_url, api_key="unused", timeout=TIMEOUT, max_retries=0)
        done = client.completions.create(model="tiny", prompt="hi", max_tokens=3, temperature=0)
        assert done.choices[0].text == expected("hi", 3)
        time.sleep(SPARE_IDLE_S + 1)
        stopping = time.monotonic()
    took = time.monotonic() - stopping
    client.close()
    log = pod.log.read_text()
    # An idle connection would hold the stop for the whole exit timeout, and Triton says so: its
    # words are the check; the time only bounds it (a loaded machine stops slower, 4.1 s seen).
    assert "HTTP service connections" not in log and "Exit timeout expired" not in log, log[-2000:]
    assert "Traceback" not in log, log[-2000:]
    assert took < 10, f"the pod took {took:.1f} s to stop"
