"""The CPU reference runtime on a real Triton server: the ensemble's contract, streaming over
gRPC, concurrent HTTP with dynamic batching, and the queue metrics the autoscaler reads."""

from __future__ import annotations

import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from llm_operator.runtime.cpu_reference.tiny_lm import TinyLM

from tests.triton.conftest import Server, cpu_spec

pytestmark = pytest.mark.triton


def expected(prompt: str, max_tokens: int) -> str:
    seed = int(__import__("hashlib").sha256(cpu_spec(True).model.revision.encode()).hexdigest()[:8], 16)
    return "".join(TinyLM(seed, 256).generate(prompt, max_tokens))


def http_inputs(prompt: str, max_tokens: int) -> list[Any]:
    text = httpclient.InferInput("text_input", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[prompt.encode()]], dtype=np.object_))
    tokens = httpclient.InferInput("max_tokens", [1, 1], "INT32")
    tokens.set_data_from_numpy(np.array([[max_tokens]], dtype=np.int32))
    return [text, tokens]


def test_concurrent_http_requests_are_batched_and_metered(batch_server: Server) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{batch_server.http}", concurrency=16)
    prompts = [f"request {i}" for i in range(24)]
    pending_seen: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            pending_seen.append(batch_server.metric("nv_inference_pending_request_count"))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(lambda p: client.infer("ensemble", http_inputs(p, 24)), prompts))
    finally:
        stop.set()
        watcher.join()
    for prompt, result in zip(prompts, results, strict=True):
        assert result.as_numpy("text_output").reshape(-1)[0].decode() == expected(prompt, 24)
    assert batch_server.metric("nv_inference_request_success") >= len(prompts)
    executions = batch_server.metric("nv_inference_exec_count")
    assert executions < len(prompts), "dynamic batching should group concurrent requests"
    assert batch_server.metric("nv_inference_queue_duration_us") > 0
    assert batch_server.metric("nv_inference_compute_infer_duration_us") > 0
    assert max(pending_seen) > 0, "requests queued under load (the autoscaler's signal)"


def test_grpc_stream_returns_tokens_one_by_one(streaming_server: Server) -> None:
    responses: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{streaming_server.grpc}")
    client.start_stream(callback=lambda result, error: responses.put(error or result))
    inputs = []
    for name, dtype, value in [("text_input", "BYTES", np.array([[b"Hello"]], dtype=np.object_)),
                               ("max_tokens", "INT32", np.array([[12]], dtype=np.int32)),
                               ("stream", "BOOL", np.array([[True]]))]:  # fmt: skip
        tensor = grpcclient.InferInput(name, list(value.shape), dtype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    client.async_stream_infer("ensemble", inputs, enable_empty_final_response=True)
    pieces = []
    while True:
        item = responses.get(timeout=30)
        assert not isinstance(item, Exception), item
        if item.get_response().parameters["triton_final_response"].bool_param:
            break
        pieces.append(item.as_numpy("text_output").reshape(-1)[0].decode())
    client.stop_stream()
    assert len(pieces) == 12, "one response per token"
    assert "".join(pieces) == expected("Hello", 12)
