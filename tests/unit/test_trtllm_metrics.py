"""The llmapi wrapper's gauges (runtime/trtllm_metrics.py) against a stand-in for Triton's metrics
API: iteration stats set them, a poll without iterations reads as idle."""

from __future__ import annotations

import json
from typing import Any

from llm_operator.runtime.trtllm_metrics import KV_CACHE_BLOCK_METRICS, REQUEST_METRICS, IterationGauges


class Metric:
    def __init__(self, labels: dict[str, str]) -> None:
        self.labels, self.value = labels, 0.0

    def set(self, value: float) -> None:
        self.value = value


class Family:
    GAUGE = "gauge"
    made: list[Family] = []

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name, self.metrics = name, []  # type: ignore[var-annotated]
        Family.made.append(self)

    def Metric(self, labels: dict[str, str]) -> Metric:
        self.metrics.append(metric := Metric(labels))
        return metric


class PbUtils:
    MetricFamily = Family


def values() -> dict[tuple[str, str], float]:
    return {(f.name, m.labels.get("request_type") or m.labels["kv_cache_block_type"]): m.value
            for f in Family.made for m in f.metrics}  # fmt: skip


STATS: dict[str, Any] = {
    "numActiveRequests": 2, "numQueuedRequests": 0, "maxNumActiveRequests": 8,
    "inflightBatchingStats": {"numScheduledRequests": 2, "numContextRequests": 2},
    "kvCacheStats": {"maxNumBlocks": 64, "freeNumBlocks": 60, "usedNumBlocks": 4, "tokensPerBlock": 32},
}  # fmt: skip


def test_stats_set_the_backends_gauges_and_an_empty_poll_reads_idle() -> None:
    Family.made.clear()
    g = IterationGauges(PbUtils(), "tensorrt_llm", "1")
    assert {m.labels["model"] for f in Family.made for m in f.metrics} == {"tensorrt_llm"}
    g.update(json.dumps(STATS))  # older releases yield the JSON text
    v = values()
    assert (
        v[(REQUEST_METRICS, "active")],
        v[(REQUEST_METRICS, "context")],
        v[(REQUEST_METRICS, "waiting")],
    ) == (2, 2, 0)
    assert (v[(KV_CACHE_BLOCK_METRICS, "used")], v[(KV_CACHE_BLOCK_METRICS, "fraction")]) == (4, 4 / 64)
    g.idle()
    v = values()
    assert [v[(REQUEST_METRICS, k)] for k in ("active", "scheduled", "context", "waiting", "max")] == [
        0,
        0,
        0,
        0,
        8,
    ]
    assert [v[(KV_CACHE_BLOCK_METRICS, k)] for k in ("used", "free", "max", "fraction", "tokens_per")] == [
        0, 64, 64, 0, 32
    ]  # fmt: skip


def test_without_kv_cache_stats_the_kv_gauges_stay_unset() -> None:
    Family.made.clear()
    g = IterationGauges(PbUtils(), "m", "1")
    g.update({k: v for k, v in STATS.items() if k != "kvCacheStats"})
    g.idle()
    assert values()[(KV_CACHE_BLOCK_METRICS, "max")] == 0
    assert values()[(REQUEST_METRICS, "max")] == 8
