"""The CPU reference runtime on the LLM API contract (engine.cpuReference.contract: pytorch), served
by a real tritonserver from the operator-rendered repository: upstream's `tensorrt_llm` model
contract (text in, the whole text so far in every streamed response, finish_reason), and the C++
backend's load gauges, which the operator's wrapper (the same model.py as on GPU pods) sets from the
CPU engine's iteration stats."""

from __future__ import annotations

import http.client
import itertools
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from prometheus_client.parser import text_string_to_metric_families

from tests.triton.conftest import cpu_spec, expected, serve
from tests.triton.server import TritonProcess
from tests.triton.test_load_metrics import BLOCKS, REQUESTS

pytestmark = pytest.mark.triton

MODEL = "tensorrt_llm"
BATCH = 8  # cpu_spec's maxBatchSize


def llmapi_spec() -> LLMDeploymentSpec:
    spec = cpu_spec(streaming=True).model_dump(by_alias=True, exclude_none=True)
    spec["engine"]["cpuReference"] = {"contract": "pytorch"}
    return LLMDeploymentSpec.model_validate(spec)


@pytest.fixture(scope="module")
def llmapi_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonProcess]:
    yield from serve(tmp_path_factory.mktemp("triton-llmapi"), llmapi_spec())


def body(prompt: str, max_tokens: int, **extra: Any) -> bytes:
    return json.dumps({"text_input": prompt, "sampling_param_max_tokens": max_tokens,
                       "sampling_param_exclude_input_from_output": True, **extra}).encode()  # fmt: skip


def generate(server: TritonProcess, prompt: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    url = f"http://127.0.0.1:{server.http_port}/v2/models/{MODEL}/generate"
    request = urllib.request.Request(url, data=body(prompt, max_tokens, **extra), method="POST")
    with urllib.request.urlopen(request, timeout=60) as r:
        return dict(json.loads(r.read()))


def stream(server: TritonProcess, prompt: str, max_tokens: int, **extra: Any) -> list[dict[str, Any]]:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=120)
    connection.request(
        "POST", f"/v2/models/{MODEL}/generate_stream", body(prompt, max_tokens, streaming=True, **extra)
    )
    events = []
    with connection.getresponse() as response:
        for line in response:
            if line.startswith(b"data: "):
                events.append(json.loads(line[6:]))
    connection.close()
    return events


def gauges(server: TritonProcess) -> dict[tuple[str, str], float]:
    """(family, request_type or kv_cache_block_type) -> value, of this model's series."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {
        (
            sample.name,
            sample.labels.get("request_type") or sample.labels.get("kv_cache_block_type") or "",
        ): sample.value
        for family in text_string_to_metric_families(text)
        if family.name in (REQUESTS, BLOCKS)
        for sample in family.samples
        if sample.labels.get("model") == MODEL and sample.labels.get("version") == "1"
    }


def test_streamed_responses_carry_the_whole_text_so_far(llmapi_server: TritonProcess) -> None:
    want = expected("Hello", 12)
    events = stream(llmapi_server, "Hello", 12, return_finish_reason=True)
    texts = [e["text_output"] for e in events]
    assert texts[-1] == want
    assert len(texts) > 1 and all(b.startswith(a) and len(b) > len(a) for a, b in itertools.pairwise(texts))
    assert events[-1]["finish_reason"] == "length"
    assert generate(llmapi_server, "Hello", 12)["text_output"] == want  # unstreamed: the same text


def test_finish_and_stop_reasons_when_asked(llmapi_server: TritonProcess) -> None:
    whole = expected("Hi", 20)
    stop = whole[5:7]
    answer = generate(llmapi_server, "Hi", 20, sampling_param_stop=[stop], return_finish_reason=True,
                      return_stop_reason=True, return_cumulative_logprob=True)  # fmt: skip
    assert answer["text_output"] == whole[: whole.index(stop) + len(stop)]
    assert (answer["finish_reason"], answer["stop_reason"]) == ("stop", stop)
    assert float(answer["cumulative_logprob"]) < 0
    assert "finish_reason" not in generate(llmapi_server, "Hi", 3)  # only when asked, as upstream


def test_refusals_are_errors_by_name(llmapi_server: TritonProcess) -> None:
    with pytest.raises(urllib.error.HTTPError) as e:
        generate(llmapi_server, "Hi", 100000)
    assert "max_tokens must be" in e.value.read().decode()


def test_gauges_follow_the_engine_under_load_and_back_to_idle(llmapi_server: TritonProcess) -> None:
    peaks: dict[tuple[str, str], float] = {}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for key, value in gauges(llmapi_server).items():
                peaks[key] = max(peaks.get(key, 0.0), value)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    prompts = [f"load {i}" for i in range(BATCH + 4)]  # more requests than the batch: some wait
    results: dict[str, str] = {}

    def run(prompt: str) -> None:
        results[prompt] = stream(llmapi_server, prompt, 100)[-1]["text_output"]

    threads = [threading.Thread(target=run, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    watcher.join()
    assert results == {p: expected(p, 100) for p in prompts}  # batched, still deterministic
    assert peaks[(REQUESTS, "waiting")] > 0
    assert peaks[(REQUESTS, "active")] > 0 and peaks[(REQUESTS, "max")] == BATCH
    assert peaks[(BLOCKS, "used")] > 0 and peaks[(BLOCKS, "tokens_per")] == 32
    deadline = time.monotonic() + 10  # a poll without iterations reads as idle
    while (m := gauges(llmapi_server))[(REQUESTS, "active")] or m[(BLOCKS, "used")]:
        assert time.monotonic() < deadline, m
        time.sleep(0.2)
    assert m[(REQUESTS, "waiting")] == 0 and m[(BLOCKS, "free")] == m[(BLOCKS, "max")] > 0
