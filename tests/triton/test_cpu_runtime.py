"""The CPU reference runtime on a real Triton server: the ensemble's contract, token streaming over
gRPC, concurrent HTTP requests batched dynamically, and the metrics the autoscaler reads. The
ensemble's requests are decoded by `tensorrt_llm` (the repository's one decoder, which the front
door calls too): its batches and metrics are read there."""

from __future__ import annotations

import http.client
import json
import math
import queue
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from llm_operator.runtime.cpu_reference.tiny_lm import Penalties, Sampler, encode
from tritonclient.utils import InferenceServerException

from tests.triton.conftest import expected
from tests.triton.server import TritonProcess

pytestmark = pytest.mark.triton

MODEL = "ensemble"  # the text contract /v2 clients call
ENGINE = "tensorrt_llm"  # the one decoder, that the ensemble calls (BLS)


def tensors(module: Any, **values: Any) -> list[Any]:
    """Client input tensors with a batch dimension of 1, typed as the ensemble declares them."""
    types = {str: ("BYTES", np.object_), bool: ("BOOL", np.bool_), int: ("INT32", np.int32),
             float: ("FP32", np.float32)}  # fmt: skip
    out = []
    dtype: Any  # a numpy scalar type
    for name, value in values.items():
        if name == "seed":
            triton_type, dtype = "UINT64", np.uint64
        else:
            triton_type, dtype = types[type(value)]
        data = np.array([[value.encode() if isinstance(value, str) else value]], dtype=dtype)
        tensor = module.InferInput(name, list(data.shape), triton_type)
        tensor.set_data_from_numpy(data)
        out.append(tensor)
    return out


class Stream:
    """A gRPC client with one open stream (tritonclient allows one per client)."""

    def __init__(self, server: TritonProcess) -> None:
        self.responses: queue.Queue[Any] = queue.Queue()
        self.client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        self.client.start_stream(callback=lambda result, error: self.responses.put(error or result))

    def request(self, **inputs: Any) -> list[tuple[str, bool]]:
        """Every response's (text, final flag), in order."""
        self.client.async_stream_infer(
            MODEL, tensors(grpcclient, stream=True, **inputs), enable_empty_final_response=True
        )
        out = []
        while True:
            item = self.responses.get(timeout=60)
            if isinstance(item, Exception):
                raise item
            final = item.get_response().parameters["triton_final_response"].bool_param
            text = item.as_numpy("text_output")
            out.append(("" if text is None else text.reshape(-1)[0].decode(), final))
            if final:
                return out

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def stream(server: TritonProcess, **inputs: Any) -> list[tuple[str, bool]]:
    s = Stream(server)
    try:
        return s.request(**inputs)
    finally:
        s.close()


def test_loads_the_rendered_config(streaming_server: TritonProcess) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{streaming_server.grpc_port}")
    config = client.get_model_config(MODEL).config
    assert config.max_batch_size == 8
    assert config.model_transaction_policy.decoupled
    assert config.dynamic_batching.max_queue_delay_microseconds == 20000
    assert {i.name for i in config.input} >= {"text_input", "max_tokens", "stream", "temperature", "seed"}
    assert [o.name for o in config.output] == ["text_output"]


def test_grpc_stream_sends_one_response_per_token(streaming_server: TritonProcess) -> None:
    """As upstream's ensemble and tensorrt_llm_bls stream: a response per token, then the final
    flag alone."""
    responses = stream(streaming_server, text_input="Hello", max_tokens=12)
    assert len(responses) == 13, "one response per token, then the final one"
    assert all(len(text) == 1 for text, _ in responses[:-1])
    assert [final for _, final in responses] == [False] * 12 + [True]
    assert responses[-1] == ("", True)
    text = "".join(t for t, _ in responses)
    assert text == expected("Hello", 12)
    assert "".join(t for t, _ in stream(streaming_server, text_input="Hello", max_tokens=12)) == text


def settled_metrics(server: TritonProcess) -> dict[str, float]:
    """The model's metrics once the requests of earlier tests are counted: a decoupled request's
    last response reaches its client before Triton counts it a success."""
    last = server.metrics(ENGINE)
    for _ in range(50):
        time.sleep(0.1)
        now = server.metrics(ENGINE)
        if now["nv_inference_request_success"] == last["nv_inference_request_success"]:
            return now
        last = now
    return last


def test_concurrent_streams_batch_together_and_stay_deterministic(streaming_server: TritonProcess) -> None:
    requests = [(f"prompt number {i}", 8 + 3 * i) for i in range(6)]
    streams = [Stream(streaming_server) for _ in requests]
    together = threading.Barrier(len(requests))  # all sent within the batching window

    def run(s: Stream, request: tuple[str, int]) -> list[tuple[str, bool]]:
        together.wait()
        return s.request(text_input=request[0], max_tokens=request[1])

    before = settled_metrics(streaming_server)
    try:
        with ThreadPoolExecutor(len(requests)) as pool:
            results = list(pool.map(run, streams, requests))
    finally:
        for s in streams:
            s.close()
    for (prompt, max_tokens), responses in zip(requests, results, strict=True):
        assert "".join(t for t, _ in responses) == expected(prompt, max_tokens)
    after = streaming_server.metrics(ENGINE)
    assert after["nv_inference_request_success"] - before["nv_inference_request_success"] == len(requests)
    assert after["nv_inference_exec_count"] - before["nv_inference_exec_count"] < len(requests), "batched"


def timed_stream(
    server: TritonProcess, prompt: str, max_tokens: int, first: threading.Event | None = None
) -> list[float]:
    """Arrival times (monotonic) of a generate_stream request's events; sets `first` at the first."""
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    body = json.dumps({"text_input": prompt, "max_tokens": max_tokens, "stream": True})
    connection.request("POST", f"/v2/models/{MODEL}/generate_stream", body)
    times = []
    with connection.getresponse() as response:
        for line in response:
            if line.startswith(b"data: "):
                times.append(time.monotonic())
                if first is not None:
                    first.set()
    connection.close()
    return times


def test_a_request_queued_behind_a_batch_starts_when_the_batch_ends(streaming_server: TritonProcess) -> None:
    """The next batch is ready when the instance frees, not at the dynamic batcher's next 500 ms
    tick: with a queue bound Triton 2.51 does not prefetch (core r24.10 src/scheduler_utils.cc
    support_prefetching_), and a request that came while the only instance decoded then waited
    about 505 ms after it in 2 to 6 of these 12 rounds (docs/runtime.md "Queue bounds"). One slow
    round is allowed to this machine's load. A round whose first request had already ended when
    the second was sent (its reader starved while the events piled up) proves nothing and is run
    again."""
    config = (streaming_server.repo / ENGINE / "config.pbtxt").read_text()
    assert "count: 1 kind: KIND_CPU" in config, "one instance: the second request must wait for it"
    gaps: list[float] = []
    for i in range(24):
        decoding = threading.Event()
        with ThreadPoolExecutor(1) as pool:
            batch = pool.submit(timed_stream, streaming_server, f"a long answer {i}", 200, decoding)
            assert decoding.wait(30)
            sent = time.monotonic()
            queued = timed_stream(streaming_server, f"queued {i}", 2)
            ended = batch.result()[-1]
        if sent < ended:  # the second request came while the first decoded
            gaps.append(queued[0] - ended)  # this side's clock: the end may be read late, never early
        if len(gaps) == 12:
            break
    assert len(gaps) == 12, f"only {len(gaps)} of 24 rounds sent the second request during the first"
    assert sum(g > 0.25 for g in gaps) <= 1, [f"{g * 1000:.0f} ms" for g in gaps]


def test_sampling_inputs_and_stop_words(streaming_server: TritonProcess) -> None:
    sampled = stream(
        streaming_server, text_input="Once", max_tokens=16, temperature=0.7, top_k=40, top_p=0.9, seed=5
    )
    text = "".join(t for t, _ in sampled)
    assert text == expected("Once", 16, Sampler(temperature=0.7, top_k=40, top_p=0.9, seed=5))
    assert text != expected("Once", 16), "sampling differs from greedy"
    greedy = expected("Once", 16)
    stop = greedy[4:6]
    cut = greedy[: greedy.index(stop) + len(stop)]
    stopped = stream(streaming_server, text_input="Once", max_tokens=16, stop_words=stop)
    assert "".join(t for t, _ in stopped) == cut, "generation ends with the stop word"


def test_penalties_as_vllm_applies_them() -> None:
    """Repetition scales the logit of every token seen (prompt and output) away from zero; presence
    and frequency subtract for output tokens, once and per occurrence."""
    logits = torch.tensor([2.0, -2.0, 1.0, 1.0], dtype=torch.float64)
    counts = Counter({2: 3})
    out = Penalties(repetition=2.0, presence=0.5, frequency=0.25).apply(logits, [0, 1], counts)
    assert out.tolist() == [1.0, -4.0, 1.0 / 2 - 0.5 - 0.75, 1.0]
    assert logits.tolist() == [2.0, -2.0, 1.0, 1.0], "the batch's logits are left as they were"
    assert Penalties(repetition=0.0).problem() and Penalties(presence=math.nan).problem()


def test_penalty_min_tokens_and_end_id_inputs(streaming_server: TritonProcess) -> None:
    """The knobs clients send (the front door maps ignore_eos to end_id -1): penalties change the
    text exactly as the reference applies them; min_tokens and an end id change nothing on a model
    with no end token, and are accepted as the ensemble declares them."""
    prompt, knobs = "Once upon a time", {"repetition_penalty": 1.8, "presence_penalty": 1.5}
    penalized = stream(streaming_server, text_input=prompt, max_tokens=24, **knobs)
    fp32 = {k: float(np.float32(v)) for k, v in knobs.items()}  # as the FP32 inputs carry them
    as_sent = Penalties(repetition=fp32["repetition_penalty"], presence=fp32["presence_penalty"])
    reference = expected(prompt, 24, Sampler(penalties=as_sent, prompt=tuple(encode(prompt))))
    assert "".join(t for t, _ in penalized) == reference != expected(prompt, 24)
    ended = stream(streaming_server, text_input=prompt, max_tokens=24, min_tokens=8, end_id=-1)
    assert "".join(t for t, _ in ended) == expected(prompt, 24)
    with pytest.raises(InferenceServerException, match="repetition_penalty must be"):
        stream(streaming_server, text_input=prompt, max_tokens=4, repetition_penalty=0.0)


def test_http_generate_endpoint_on_the_streaming_server(streaming_server: TritonProcess) -> None:
    """What `curl .../v2/models/ensemble/generate` gets: the whole text in one JSON answer."""
    body = json.dumps({"text_input": "Hello", "max_tokens": 10}).encode()
    url = f"http://127.0.0.1:{streaming_server.http_port}/v2/models/{MODEL}/generate"
    with urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST"), timeout=30) as r:
        answer = json.loads(r.read())
    assert answer["text_output"] == expected("Hello", 10)


def test_concurrent_http_requests_are_batched_and_metered(batch_server: TritonProcess) -> None:
    """32 concurrent requests, batched and counted. The queue they wait in is seen through the
    pending-requests gauge (the autoscaler's signal) by a sampling thread; a round whose sampler
    the loaded machine starved while the queue stood proves nothing and is run again, at most
    three rounds (a gauge that never moves fails all three)."""
    for _ in range(3):
        pending = _batched_round(batch_server)
        if max(pending) > 0:
            break
    assert max(pending) > 0, "requests waited in the queue: the autoscaler's pending-requests signal"


def _batched_round(batch_server: TritonProcess) -> list[float]:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{batch_server.http_port}", concurrency=16)
    prompts = [f"request {i}" for i in range(32)]
    before = batch_server.metrics(ENGINE)
    pending: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            pending.append(batch_server.metrics(ENGINE)["nv_inference_pending_request_count"])

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        # The client's own concurrency (gevent greenlets): it may not be shared between threads.
        sent = [client.async_infer(MODEL, tensors(httpclient, text_input=p, max_tokens=48)) for p in prompts]
        results = [request.get_result() for request in sent]
    finally:
        stop.set()
        watcher.join()
        client.close()
    for prompt, result in zip(prompts, results, strict=True):
        assert result.as_numpy("text_output").reshape(-1)[0].decode() == expected(prompt, 48)
    after = batch_server.metrics(ENGINE)
    moved = {name: after[name] - before.get(name, 0.0) for name in after}
    assert moved["nv_inference_request_success"] == len(prompts)
    assert moved["nv_inference_count"] == len(prompts)
    assert 0 < moved["nv_inference_exec_count"] < len(prompts), "dynamic batching grouped requests"
    assert moved["nv_inference_queue_duration_us"] > 0
    assert moved["nv_inference_compute_infer_duration_us"] > 0
    return pending


def test_http_request_options_and_refusals(batch_server: TritonProcess) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{batch_server.http_port}")
    try:
        echoed = client.infer(
            MODEL, tensors(httpclient, text_input="Hi", max_tokens=5, exclude_input_in_output=False)
        )
        assert echoed.as_numpy("text_output").reshape(-1)[0].decode() == "Hi" + expected("Hi", 5)
        with pytest.raises(InferenceServerException, match="max_input_len"):
            client.infer(MODEL, tensors(httpclient, text_input="x" * 65, max_tokens=5))
        with pytest.raises(InferenceServerException, match="decoupled"):
            client.infer(MODEL, tensors(httpclient, text_input="Hi", max_tokens=5, stream=True))
    finally:
        client.close()


@pytest.mark.parametrize("name", ["random_seed", "min_length"])
def test_spellings_the_ensemble_does_not_declare_are_refused_by_name(
    batch_server: TritonProcess, name: str
) -> None:
    """docs/api.md: the ensemble takes the release's `seed` (and `min_tokens` on GPUs); the older
    `random_seed` / `min_length` are refused by Triton, naming the input."""
    client = httpclient.InferenceServerClient(f"127.0.0.1:{batch_server.http_port}")
    try:
        with pytest.raises(InferenceServerException, match=f"unexpected inference input '{name}'"):
            client.infer(MODEL, tensors(httpclient, text_input="Hi", max_tokens=5, **{name: 7}))
    finally:
        client.close()


BAD_SAMPLING = [
    ({"temperature": float("nan"), "top_k": 5}, "temperature"),
    ({"temperature": float("inf"), "top_k": 5}, "temperature"),
    ({"temperature": -0.5, "top_p": 0.9}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_p": float("nan"), "top_k": 3}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 10_000}, "max_tokens"),
]


@pytest.mark.parametrize(
    ("bad", "field"), BAD_SAMPLING, ids=[f"{f}-{i}" for i, (_, f) in enumerate(BAD_SAMPLING)]
)
def test_a_bad_request_gets_a_400_and_its_batch_mates_their_answers(
    batch_server: TritonProcess, bad: dict[str, Any], field: str
) -> None:
    """A NaN temperature with top_k > 1 used to fail every request batched with it ("probability
    tensor contains nan"): now that one request is refused, as the client's error."""
    client = httpclient.InferenceServerClient(f"127.0.0.1:{batch_server.http_port}", concurrency=8)
    prompts = [f"mate {i}" for i in range(6)]
    before = batch_server.metrics(ENGINE)
    try:
        # Sent together, inside the 20 ms batching window: Triton batches them (checked below).
        good = [client.async_infer(MODEL, tensors(httpclient, text_input=p, max_tokens=24, top_k=4, seed=3))
                for p in prompts[:3]]  # fmt: skip
        refused = client.async_infer(
            MODEL, tensors(httpclient, **{"text_input": "bad", "max_tokens": 8, **bad})
        )
        good += [client.async_infer(MODEL, tensors(httpclient, text_input=p, max_tokens=24, top_k=4, seed=3))
                 for p in prompts[3:]]  # fmt: skip
        with pytest.raises(InferenceServerException) as error:
            refused.get_result()
        results = [r.get_result() for r in good]
    finally:
        client.close()
    assert error.value.status() == "400" and field in str(error.value)
    for prompt, result in zip(prompts, results, strict=True):
        text = result.as_numpy("text_output").reshape(-1)[0].decode()
        assert text == expected(prompt, 24, Sampler(top_k=4, seed=3))
    moved = {k: v - before.get(k, 0.0) for k, v in batch_server.metrics(ENGINE).items()}
    assert moved["nv_inference_exec_count"] < len(prompts) + 1, "the bad request was batched with others"
    assert moved["nv_inference_request_failure"] == 0, "no batch failed"


def test_pending_metric_has_the_labels_the_adapter_rules_select(batch_server: TritonProcess) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{batch_server.metrics_port}/metrics", timeout=5) as r:
        assert 'nv_inference_pending_request_count{model="tensorrt_llm",version="1"}' in r.read().decode()


def stub_maps(server: TritonProcess) -> dict[str, str]:
    """Model name -> the memory map (/proc/PID/maps) of its python stub process (one per instance:
    the first found), for this server's repository."""
    out: dict[str, str] = {}
    for proc in Path("/proc").iterdir():
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
            model_py = Path(args[1].decode()) if len(args) > 1 and args[0].endswith(b"_stub") else None
            if model_py is not None and model_py.is_relative_to(server.repo):
                out.setdefault(model_py.relative_to(server.repo).parts[0], (proc / "maps").read_text())
        except (OSError, IndexError):
            continue  # a process that ended, or not ours to read
    return out


def test_only_tensorrt_llm_loads_the_model_and_exports_its_signals(streaming_server: TritonProcess) -> None:
    """One decoder per pod, as on GPUs: the ensemble's process loads the tokenizer and never torch
    (no weights), and the load gauges, TTFT histogram and token counts exist for tensorrt_llm only,
    so whatever reads them (the endpoint picker matches no model label) reads the decoder's."""
    maps = stub_maps(streaming_server)
    assert set(maps) == {MODEL, ENGINE}
    assert "libtorch" in maps[ENGINE] and "libtorch" not in maps[MODEL]
    stream(streaming_server, text_input="Hello", max_tokens=2)
    with urllib.request.urlopen(f"http://127.0.0.1:{streaming_server.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    signals = ("nv_trt_llm_", "nv_llm_", "nv_inference_first_response_histogram_ms")
    lines = [line for line in text.splitlines() if line.startswith(signals)]
    assert [line for line in lines if f'model="{MODEL}"' in line] == []
    for family in signals:
        assert [line for line in lines if line.startswith(family) and f'model="{ENGINE}"' in line], family
