"""The CPU runtime's TEST-ONLY fault knob and its time-to-first-token histogram on a real Triton
server: injected errors are the failures Triton counts, injected delays land in the histogram on the
right side of the bucket edge the operator renders at the canary analysis's budget."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import tritonclient.grpc as grpcclient
from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from prometheus_client.parser import text_string_to_metric_families

from tests.triton.conftest import cpu_spec, expected, serve
from tests.triton.server import TritonProcess
from tests.triton.test_cpu_runtime import ENGINE, MODEL, Stream, tensors

pytestmark = pytest.mark.triton

BUDGET_MS = 250
TTFT_MS, LATENCY_MS = 300, 400
HISTOGRAM = "nv_inference_first_response_histogram_ms"


def budgeted(streaming: bool) -> LLMDeploymentSpec:
    doc = cpu_spec(streaming).model_dump(by_alias=True, exclude_none=True)
    doc["rollout"] = {
        "canary": {
            "steps": [{"weight": 10}],
            "analysis": {"prometheus": {"url": "http://prometheus:9090"},
                         "maxTimeToFirstTokenMilliseconds": BUDGET_MS},
        }
    }  # fmt: skip
    return LLMDeploymentSpec.model_validate(doc)


@pytest.fixture(scope="module", params=[True, False], ids=["streaming", "batch"])
def faulty_server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[TritonProcess]:
    env = {"LLMOP_FAULT_ERROR_PERCENT": "25", "LLMOP_FAULT_TTFT_MS": str(TTFT_MS),
           "LLMOP_FAULT_LATENCY_MS": str(LATENCY_MS)}  # fmt: skip
    yield from serve(tmp_path_factory.mktemp("triton-faulty"), budgeted(streaming=request.param), env)


def scrape(server: TritonProcess) -> dict[tuple[str, str], float]:
    """(sample name, le or reason) -> value, for the series of tensorrt_llm, which the ensemble
    calls: the decoder, the only model with the fault knob and the histogram."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("model") == ENGINE and s.labels.get("version") == "1":
                name = s.name.removesuffix("_total")  # the parser names counter samples <name>_total
                le = s.labels.get("le")  # "250", "250.0" or "+Inf" depending on the writer
                key = (name, str(float(le)) if le else s.labels.get("reason") or "")
                out[key] = out.get(key, 0.0) + s.value
    return out


def generate(server: TritonProcess, prompt: str) -> str | None:
    """text_output, or None when the server answered with an error."""
    body = json.dumps({"text_input": prompt, "max_tokens": 4}).encode()
    url = f"http://127.0.0.1:{server.http_port}/v2/models/{MODEL}/generate"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST"), timeout=30) as r:
            return str(json.loads(r.read())["text_output"])
    except urllib.error.HTTPError as e:
        error = e.read().decode()
    assert "injected fault (LLMOP_FAULT_ERROR_PERCENT=25, test only)" in error
    return None


def test_injected_errors_delays_and_the_ttft_histogram(faulty_server: TritonProcess) -> None:
    assert "TEST-ONLY fault knob on" in faulty_server.log_tail(100_000)
    answers = [generate(faulty_server, f"p{i}") for i in range(8)]
    # 25 %: exactly requests 3 and 7 of every 8, deterministic.
    assert [i for i, a in enumerate(answers) if a is None] == [3, 7]
    assert answers[0] == expected("p0", 4)
    m = scrape(faulty_server)
    assert m[("nv_inference_request_success", "")] == 6
    assert sum(v for (name, _), v in m.items() if name == "nv_inference_request_failure") == 2
    # A request answered once gets its first response with its last: TTFT + decode + latency.
    assert m[(f"{HISTOGRAM}_count", "")] == 6
    assert m[(f"{HISTOGRAM}_bucket", str(float(BUDGET_MS)))] == 0
    assert m[(f"{HISTOGRAM}_bucket", "500.0")] == 0
    assert m[(f"{HISTOGRAM}_sum", "")] >= 6 * (TTFT_MS + LATENCY_MS)

    if "decoupled: false" in (faulty_server.repo / ENGINE / "config.pbtxt").read_text():
        return
    # Streaming: the first token comes after the injected TTFT, the last one after the latency too.
    stream = Stream(faulty_server)
    try:
        started = time.monotonic()
        inputs = tensors(grpcclient, text_input="Hello", max_tokens=4, stream=True)
        stream.client.async_stream_infer(MODEL, inputs, enable_empty_final_response=True)
        first = stream.responses.get(timeout=60)
        ttft = time.monotonic() - started
        while not first.get_response().parameters["triton_final_response"].bool_param:
            first = stream.responses.get(timeout=60)
        total = time.monotonic() - started
    finally:
        stream.close()
    assert TTFT_MS / 1000 <= ttft < (TTFT_MS + LATENCY_MS) / 1000 <= total
    m = scrape(faulty_server)
    assert m[(f"{HISTOGRAM}_count", "")] == 7
    # Buckets: Triton's defaults, the budget and twice the budget.
    edges = sorted(float(le) for (name, le) in m if name == f"{HISTOGRAM}_bucket" and le != "inf")
    assert edges == [100.0, 250.0, 500.0, 2000.0, 5000.0]
    assert m[(f"{HISTOGRAM}_bucket", str(float(BUDGET_MS)))] == 0
    assert m[(f"{HISTOGRAM}_bucket", "500.0")] == 1


def test_without_the_knob_requests_pass_and_first_responses_are_metered(
    streaming_server: TritonProcess,
) -> None:
    before = scrape(streaming_server)
    assert generate(streaming_server, "Hello") == expected("Hello", 4)
    after = scrape(streaming_server)
    count = (f"{HISTOGRAM}_count", "")
    assert after[count] - before.get(count, 0.0) == 1
    # No budget: Triton's default buckets only.
    edges = sorted(float(le) for (name, le) in after if name == f"{HISTOGRAM}_bucket" and le != "inf")
    assert edges == [100.0, 500.0, 2000.0, 5000.0]


STEP_MS, TOKENS, CONCURRENT = 100, 4, 6


@pytest.fixture(scope="module")
def slow_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonProcess]:
    yield from serve(tmp_path_factory.mktemp("triton-slow"), cpu_spec(streaming=False),
                     {"LLMOP_FAULT_STEP_MS": str(STEP_MS)})  # fmt: skip


def load_gauges(server: TritonProcess) -> dict[str, float]:
    """The TensorRT-LLM load gauges the endpoint picker reads: request_type, or kv_<kv_cache_block_type>,
    of tensorrt_llm, the one decoder, which the ensemble's requests go to."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {
        s.labels.get("request_type") or f"kv_{s.labels['kv_cache_block_type']}": s.value
        for family in text_string_to_metric_families(text)
        if family.name in ("nv_trt_llm_request_metrics", "nv_trt_llm_kv_cache_block_metrics")
        for s in family.samples
        if s.labels.get("model") == ENGINE
    }


def test_the_step_knob_lowers_capacity_and_the_load_gauges_show_the_work(slow_engine: TritonProcess) -> None:
    """LLMOP_FAULT_STEP_MS (the routing straggler): concurrent requests take as long as the same
    requests one after another on each model instance, unlike a sleep per batch; while the engine
    works, its scheduled requests and KV-cache use (what the picker scores) are up."""
    config = (slow_engine.repo / ENGINE / "config.pbtxt").read_text()
    found = re.search(r"instance_group \[ \{ count: (\d+)", config)
    assert found is not None
    instances = int(found.group(1))
    started = time.monotonic()
    assert generate(slow_engine, "alone") == expected("alone", TOKENS)
    assert time.monotonic() - started >= TOKENS * STEP_MS / 1000
    seen: list[dict[str, float]] = []
    with ThreadPoolExecutor(CONCURRENT) as pool:
        started = time.monotonic()
        answers = [pool.submit(generate, slow_engine, f"p{i}") for i in range(CONCURRENT)]
        while not all(a.done() for a in answers):
            seen.append(load_gauges(slow_engine))
            time.sleep(0.02)
        took = time.monotonic() - started
    assert [a.result() for a in answers] == [expected(f"p{i}", TOKENS) for i in range(CONCURRENT)]
    # Every token of every request costs STEP_MS on its instance, batched or not.
    assert took >= CONCURRENT * TOKENS * STEP_MS / 1000 / instances, (took, instances)
    assert max(g["scheduled"] for g in seen) >= 2 and max(g["kv_fraction"] for g in seen) > 0
    # The backend's `waiting` is active minus scheduled (tensorrtllm_backend v0.19.0
    # inflight_batcher_llm/src/model_instance_state.cc): 0 while every admitted request is in a step.
    assert max(g["waiting"] for g in seen) == 0
    assert load_gauges(slow_engine)["scheduled"] == 0, "idle again"
