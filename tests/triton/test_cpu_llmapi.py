"""The CPU reference runtime on the LLM API contract (engine.cpuReference.contract: pytorch), served
by a real tritonserver from the operator-rendered repository: upstream's `tensorrt_llm` model
contract (text in, the whole text so far in every streamed response, finish_reason, `stop` by
request id), the C++ backend's load gauges, which the operator's wrapper (the same model.py as on
GPU pods) sets from the CPU engine's iteration stats and the preStop drain reads, what the ensemble
has beyond its contract (the TEST-ONLY fault knob, the time-to-first-response histogram), and the
OpenAI front door in front of it, as a leader pod runs them."""

from __future__ import annotations

import http.client
import itertools
import json
import queue
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.runtime.drain import inflight
from prometheus_client.parser import text_string_to_metric_families

from tests.triton.conftest import cpu_spec, expected, serve
from tests.triton.leader import leader_pod
from tests.triton.server import TritonProcess
from tests.triton.test_fault_knob import BUDGET_MS, HISTOGRAM, budgeted
from tests.triton.test_load_metrics import BLOCKS, REQUESTS

pytestmark = pytest.mark.triton

MODEL = "tensorrt_llm"
BATCH = 8  # cpu_spec's maxBatchSize


def llmapi_spec(base: LLMDeploymentSpec | None = None) -> LLMDeploymentSpec:
    spec = (base or cpu_spec(streaming=True)).model_dump(by_alias=True, exclude_none=True)
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


def metrics(server: TritonProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5) as r:
        return str(r.read().decode())


def gauges(server: TritonProcess, text: str | None = None) -> dict[tuple[str, str], float]:
    """(family, request_type or kv_cache_block_type) -> value, of this model's series."""
    text = metrics(server) if text is None else text
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
    """... and the preStop drain (runtime/drain.py), which reads them, waits while requests run
    and no longer once they are done."""
    peaks: dict[tuple[str, str], float] = {}
    queued_scrapes: list[tuple[float, float, float]] = []  # (in flight, active, waiting)
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            text = metrics(llmapi_server)
            now = gauges(llmapi_server, text)
            for key, value in now.items():
                peaks[key] = max(peaks.get(key, 0.0), value)
            if now.get((REQUESTS, "waiting")):
                queued_scrapes.append((inflight(text), now[(REQUESTS, "active")], now[(REQUESTS, "waiting")]))
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
    # The drain counts the queued ones too: whenever some waited, it saw more than the batch ran.
    # (Read scrape by scrape: on a busy machine no scrape may catch a full batch and a queue at once.)
    assert queued_scrapes and all(seen >= active + waiting for seen, active, waiting in queued_scrapes)
    deadline = time.monotonic() + 10  # a poll without iterations reads as idle
    while (m := gauges(llmapi_server))[(REQUESTS, "active")] or m[(BLOCKS, "used")]:
        assert time.monotonic() < deadline, m
        time.sleep(0.2)
    assert m[(REQUESTS, "waiting")] == 0 and m[(BLOCKS, "free")] == m[(BLOCKS, "max")] > 0
    assert inflight(metrics(llmapi_server)) == 0


def inputs(**values: Any) -> list[Any]:
    """gRPC inputs as upstream's config.pbtxt declares them (max_batch_size 0: no batch dimension)."""
    types = {"text_input": "BYTES", "streaming": "BOOL", "stop": "BOOL", "return_finish_reason": "BOOL",
             "sampling_param_max_tokens": "INT32"}  # fmt: skip
    dtypes = {"BYTES": np.object_, "BOOL": np.bool_, "INT32": np.int32}
    out = []
    for name, value in values.items():
        data = np.array([value.encode() if isinstance(value, str) else value], dtype=dtypes[types[name]])
        tensor = grpcclient.InferInput(name, list(data.shape), types[name])
        tensor.set_data_from_numpy(data)
        out.append(tensor)
    return out


# Each step of the long request below: its 200 tokens take 5 s or more, so the stop lands while it
# runs however busy the machine is (unslowed, the tiny model made them in ~0.4 s, at times before
# the stop's round trip did). The test ends as soon as the stop lands.
STOP_STEP_MS = 25


@pytest.fixture(scope="module")
def slow_llmapi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonProcess]:
    env = {"LLMOP_FAULT_STEP_MS": str(STOP_STEP_MS)}
    yield from serve(tmp_path_factory.mktemp("triton-llmapi-slow"), llmapi_spec(), env)


def test_a_stop_request_ends_the_requests_with_its_id(slow_llmapi: TritonProcess) -> None:
    """Upstream's `stop` input: the named request ends early with finish_reason "cancelled", the
    stop request itself is answered CANCELLED; without an id there is nothing to stop."""
    answers: queue.Queue[Any] = queue.Queue()
    stopper: queue.Queue[Any] = queue.Queue()
    long_client = grpcclient.InferenceServerClient(f"127.0.0.1:{slow_llmapi.grpc_port}")
    stop_client = grpcclient.InferenceServerClient(f"127.0.0.1:{slow_llmapi.grpc_port}")
    long_client.start_stream(callback=lambda result, error: answers.put(error or result))
    stop_client.start_stream(callback=lambda result, error: stopper.put(error or result))
    try:
        named = inputs(
            text_input="Hello", streaming=True, return_finish_reason=True, sampling_param_max_tokens=200
        )
        long_client.async_stream_infer(MODEL, named, request_id="r1")
        first = answers.get(timeout=60)  # it runs
        assert not isinstance(first, Exception), first
        stop_client.async_stream_infer(MODEL, inputs(text_input="", stop=True), request_id="r1")
        refused = stopper.get(timeout=60)
        assert isinstance(refused, Exception) and "Request cancelled by client" in str(refused)
        texts = []
        while True:
            item = answers.get(timeout=60)
            assert not isinstance(item, Exception), item
            texts.append(item.as_numpy("text_output").reshape(-1)[0].decode())
            if item.get_response().parameters["triton_final_response"].bool_param:
                break
        assert item.as_numpy("finish_reason").reshape(-1)[0].decode() == "cancelled"
        assert expected("Hello", 200).startswith(texts[-1].removeprefix("Hello"))
        assert len(texts[-1]) < len("Hello") + 200
        stop_client.async_stream_infer(MODEL, inputs(text_input="", stop=True))
        unnamed = stopper.get(timeout=60)
        assert isinstance(unnamed, Exception) and "A request id must be provided" in str(unnamed)
    finally:
        for client in (long_client, stop_client):
            client.stop_stream()
            client.close()


FAULT_TTFT_MS, FAULT_LATENCY_MS = 300, 400


@pytest.fixture(scope="module")
def faulty_llmapi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonProcess]:
    env = {"LLMOP_FAULT_ERROR_PERCENT": "25", "LLMOP_FAULT_TTFT_MS": str(FAULT_TTFT_MS),
           "LLMOP_FAULT_LATENCY_MS": str(FAULT_LATENCY_MS)}  # fmt: skip
    yield from serve(tmp_path_factory.mktemp("triton-llmapi-faulty"), llmapi_spec(budgeted(True)), env)


def histogram(server: TritonProcess) -> dict[tuple[str, str], float]:
    """(sample name, le) -> value of the model's first-response histogram and request counters."""
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(metrics(server)):
        for s in family.samples:
            if s.labels.get("model") == MODEL and s.name.startswith((HISTOGRAM, "nv_inference_request_")):
                key = (s.name.removesuffix("_total"), str(float(s.labels["le"])) if "le" in s.labels else "")
                out[key] = out.get(key, 0.0) + s.value
    return out


def test_the_fault_knob_and_the_ttft_histogram_as_on_the_ensemble(faulty_llmapi: TritonProcess) -> None:
    """The same knob, the same counts as tests/triton/test_fault_knob.py on the ensemble."""
    assert "TEST-ONLY fault knob on" in faulty_llmapi.log_tail(100_000)
    answers: list[str | None] = []
    for i in range(8):
        try:
            answers.append(generate(faulty_llmapi, f"p{i}", 4)["text_output"])
        except urllib.error.HTTPError as e:
            answers.append(None)
            error = e.read().decode()
    assert [i for i, a in enumerate(answers) if a is None] == [3, 7]
    assert "injected fault (LLMOP_FAULT_ERROR_PERCENT=25, test only)" in error
    assert answers[0] == expected("p0", 4)
    m = histogram(faulty_llmapi)
    assert m[("nv_inference_request_success", "")] == 6
    assert m[("nv_inference_request_failure", "")] == 2
    # Answered once: the first response is the last, after the slow prefill and the added latency.
    assert m[(f"{HISTOGRAM}_count", "")] == 6
    assert m[(f"{HISTOGRAM}_bucket", str(float(BUDGET_MS)))] == 0
    assert m[(f"{HISTOGRAM}_bucket", "500.0")] == 0
    assert m[(f"{HISTOGRAM}_sum", "")] >= 6 * (FAULT_TTFT_MS + FAULT_LATENCY_MS)
    # Streamed: the first token after the slow prefill only, within twice the budget.
    assert stream(faulty_llmapi, "Hello", 4)[-1]["text_output"] == expected("Hello", 4)
    m = histogram(faulty_llmapi)
    assert m[(f"{HISTOGRAM}_count", "")] == 7
    assert m[(f"{HISTOGRAM}_bucket", str(float(BUDGET_MS)))] == 0
    assert m[(f"{HISTOGRAM}_bucket", "500.0")] == 1


NAMES = ("llm-operator/tiny-llama", "tiny")


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    try:
        with leader_pod(tmp_path_factory.mktemp("frontdoor-llmapi"), llmapi_spec(), NAMES) as pod:
            yield openai.OpenAI(base_url=pod.base_url, api_key="unused", timeout=60, max_retries=0)
    except RuntimeError as e:
        pytest.fail(str(e))


def test_the_front_door_answers_the_models_text_once_with_its_finish_reason(client: openai.OpenAI) -> None:
    """The same text as the ensemble's front door gives (the model run in this process), each part
    once though the model sends the whole text so far, and the model's own finish_reason."""
    want = expected("Once upon a time", 12)
    whole = client.completions.create(model=NAMES[0], prompt="Once upon a time", max_tokens=12, temperature=0)
    assert (whole.choices[0].text, whole.choices[0].finish_reason) == (want, "length")
    chunks = list(client.completions.create(model=NAMES[1], prompt="Once upon a time", max_tokens=12,
                                            temperature=0, stream=True))  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks) == want
    assert [c.choices[0].finish_reason for c in chunks][-1] == "length"
    stop = want[4:6]
    cut = client.completions.create(model=NAMES[0], prompt="Once upon a time", max_tokens=12, temperature=0,
                                    stop=[stop])  # fmt: skip
    assert (cut.choices[0].text, cut.choices[0].finish_reason) == (want[: want.index(stop)], "stop")
