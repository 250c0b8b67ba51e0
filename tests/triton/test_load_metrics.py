"""The metrics the autoscaler and the dashboards read, from the CPU reference runtime on a real
Triton server: Triton's latency summaries, and the TensorRT-LLM backend's request and KV-cache
gauges (same names and labels as on GPU pods), following real requests up and back down."""

from __future__ import annotations

import re
import threading
import urllib.request

import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from tests.triton.server import TritonProcess
from tests.triton.test_cpu_runtime import ENGINE, MODEL, tensors

pytestmark = pytest.mark.triton

REQUESTS = "nv_trt_llm_request_metrics"
BLOCKS = "nv_trt_llm_kv_cache_block_metrics"


def scrape(server: TritonProcess) -> dict[tuple[str, str], float]:
    """(sample name, request_type or kv_cache_block_type) -> value summed over the series of
    tensorrt_llm, the decoder the ensemble's requests go to (histogram buckets too: use _count and _sum)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model") == ENGINE and sample.labels.get("version") == "1":
                kind = sample.labels.get("request_type") or sample.labels.get("kv_cache_block_type") or ""
                out[(sample.name, kind)] = out.get((sample.name, kind), 0.0) + sample.value
    return out


def capacity(server: TritonProcess) -> tuple[int, int]:
    """(batch slots, KV-cache blocks) of the served model: max_batch_size x instances, and
    ceil(max_seq_len / 32) blocks per slot."""
    config = (server.repo / ENGINE / "config.pbtxt").read_text()
    batch = int(re.search(r"^max_batch_size: (\d+)", config, re.M).group(1))  # type: ignore[union-attr]
    instances = int(re.search(r"count: (\d+)", config).group(1))  # type: ignore[union-attr]
    seq = int(re.search(r'"max_seq_len" value: \{ string_value: "(\d+)"', config).group(1))  # type: ignore[union-attr]
    return batch * instances, batch * instances * -(-seq // 32)


def assert_idle(server: TritonProcess) -> None:
    slots, blocks = capacity(server)
    m = scrape(server)
    assert m[(REQUESTS, "max")] == slots
    for kind in ("active", "scheduled", "context", "waiting"):
        assert m[(REQUESTS, kind)] == 0, kind
    assert (m[(BLOCKS, "max")], m[(BLOCKS, "free")], m[(BLOCKS, "used")]) == (blocks, blocks, 0)
    assert (m[(BLOCKS, "tokens_per")], m[(BLOCKS, "fraction")]) == (32, 0)


def test_latency_summaries_are_exported(batch_server: TritonProcess) -> None:
    names = {name for name, _ in scrape(batch_server)}
    for summary in ("nv_inference_request_summary_us", "nv_inference_queue_summary_us"):
        assert f"{summary}_count" in names, sorted(names)


def test_trtllm_gauges_follow_real_requests(batch_server: TritonProcess) -> None:
    assert_idle(batch_server)
    before = scrape(batch_server)
    slots, blocks = capacity(batch_server)
    seen: list[dict[tuple[str, str], float]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append(scrape(batch_server))

    client = httpclient.InferenceServerClient(f"127.0.0.1:{batch_server.http_port}", concurrency=12)
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        # The client's own concurrency (gevent greenlets): a client shared between threads fails
        # when two of them wait on its sockets ("Cannot switch to a different thread").
        # 40-token prompts + 60 tokens: every sequence holds 4 blocks of 32 tokens at the end.
        prompt = "p" * 39
        sent = [client.async_infer(MODEL, tensors(httpclient, text_input=f"{prompt}{i % 10}", max_tokens=60))
                for i in range(24)]  # fmt: skip
        for request in sent:
            request.get_result()
    finally:
        stop.set()
        watcher.join()
        client.close()
    busy = [m for m in seen if m[(REQUESTS, "active")] > 0]
    assert busy, "no scrape saw a batch being decoded"
    active = max(m[(REQUESTS, "active")] for m in busy)
    assert 1 < active <= slots, "concurrent requests shared a batch"
    # Sequences keep their cache until their batch ends: 2 blocks (40 prompt tokens) to 4 each.
    used = [m[(BLOCKS, "used")] for m in busy]
    assert 2 * active <= max(used) <= 4 * slots
    # A scrape may fall between the updates of two series; most see them agree.
    consistent = [
        m
        for m in busy
        if m[(BLOCKS, "used")] + m[(BLOCKS, "free")] == blocks
        and m[(BLOCKS, "fraction")] == pytest.approx(m[(BLOCKS, "used")] / blocks)
        and m[(REQUESTS, "scheduled")] == m[(REQUESTS, "active")]
    ]
    assert len(consistent) > len(busy) / 2
    assert_idle(batch_server)
    # Token histograms as TensorRT-LLM's backend exports them: 24 requests, 40 tokens in, 60 out.
    moved = {k: after - before.get(k, 0.0) for k, after in scrape(batch_server).items()}
    assert moved[("nv_llm_input_token_len_count", "")] == 24
    assert moved[("nv_llm_input_token_len_sum", "")] == 24 * 40
    assert moved[("nv_llm_output_token_len_sum", "")] == 24 * 60
