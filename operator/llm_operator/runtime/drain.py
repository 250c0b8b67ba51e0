"""`llm-operator-launch drain`, the preStop hook: Triton has no drain API, and a terminating pod
leaves the Service endpoints at once while proxies learn it with a delay. So wait for that, then
until rank 0 has nothing in flight, bounded; SIGTERM and Triton's exit timeout cover the rest.
"""

from __future__ import annotations

import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from llm_operator.runtime.config import PodConfig
from llm_operator.runtime.supervisor import log

PENDING = "nv_inference_pending_request_count"
TRTLLM_REQUESTS = "nv_trt_llm_request_metrics"
TRTLLM_INFLIGHT_TYPES = ("active", "waiting")


def inflight(metrics: str) -> float:
    """Requests queued in Triton or active in TensorRT-LLM's batcher (a python/ensemble request
    leaves Triton's queue when it reaches the backend, so the queue alone under-counts)."""
    # By family name: the parser renames the samples of a counter (<name>_total).
    return sum(
        sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if family.name == PENDING
        or (family.name == TRTLLM_REQUESTS and sample.labels.get("request_type") in TRTLLM_INFLIGHT_TYPES)
    )


def drain(c: PodConfig, poll: float = 0.5) -> int:
    """Give endpoint removal time to reach every proxy, then wait (bounded) until nothing is in
    flight on rank 0. Workers wait on their leader, so their ranks outlive its requests. Always 0:
    a failing preStop hook would only delay the SIGTERM that stops the pod anyway."""
    start = time.monotonic()
    host = c.leader_host if c.role == "worker" else "127.0.0.1"
    time.sleep(min(c.drain_settle, c.drain_timeout))
    if not host:
        return 0
    while True:
        try:
            url = f"http://{host}:{c.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=2) as response:
                pending = inflight(response.read().decode())
        except (OSError, ValueError):
            return 0  # not serving (any more): nothing to wait for
        if pending == 0:
            return 0
        if time.monotonic() - start >= c.drain_timeout:
            log(f"drain: {pending:g} requests still in flight after {c.drain_timeout:g}s; stopping anyway")
            return 0
        time.sleep(poll)
