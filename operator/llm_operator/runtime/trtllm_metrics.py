"""The TensorRT-LLM C++ backend's load gauges, for the models that export them through Triton's
python-backend metrics API instead: the llmapi wrapper (runtime/llmapi_model.py, from TensorRT-LLM's
iteration stats) and the CPU reference ensemble (runtime/cpu_reference/model.py, from its batches).

Names, labels and descriptions are the backend's (NVIDIA/TensorRT-LLM triton_backend/
inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc, stored copy 89fd9b74):
families nv_trt_llm_request_metrics{request_type} and nv_trt_llm_kv_cache_block_metrics
{kv_cache_block_type}, labels model and version. The values come from TensorRT-LLM's
IterationStats, as the backend's model_instance_state.cc turns them into its stats JSON:
active numActiveRequests, max maxNumActiveRequests, scheduled and context
inflightBatchingStats.numScheduledRequests / numContextRequests, waiting numActiveRequests minus
numScheduledRequests; KV blocks from kvCacheStats (maxNumBlocks, freeNumBlocks, usedNumBlocks,
tokensPerBlock), fraction used / max. tests/upstream_names.py pins these names.

Standard library only: Triton's python stub imports this file from the model's directory on GPU
pods (the serving image has no llm_operator there); the caller passes triton_python_backend_utils.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

REQUEST_METRICS = "nv_trt_llm_request_metrics"
KV_CACHE_BLOCK_METRICS = "nv_trt_llm_kv_cache_block_metrics"
REQUEST_TYPES = ("active", "max", "scheduled", "context", "waiting")
KV_CACHE_BLOCK_TYPES = ("max", "free", "used", "tokens_per", "fraction")
# The label of each family's kinds, and its description, as the C++ backend registers them.
FAMILIES = {
    REQUEST_METRICS: ("request_type", "TRT LLM request metrics", REQUEST_TYPES),
    KV_CACHE_BLOCK_METRICS: ("kv_cache_block_type", "TRT LLM KV cache block metrics", KV_CACHE_BLOCK_TYPES),
}


def gauges(pb_utils: Any, families: list[Any], labels: Mapping[str, str], name: str) -> dict[str, Any]:
    """One gauge per kind of the family `name`; the family goes into `families`, which must outlive
    its metrics (pb_utils drops a family's series with it)."""
    label, description, kinds = FAMILIES[name]
    family = pb_utils.MetricFamily(name=name, description=description, kind=pb_utils.MetricFamily.GAUGE)
    families.append(family)
    return {kind: family.Metric(labels={**labels, label: kind}) for kind in kinds}


def _count(stats: Mapping[str, Any], key: str) -> float:
    value = stats.get(key)
    return float(value) if isinstance(value, int | float) else 0.0


def from_iteration_stats(stats: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """One iteration's stats (TensorRT-LLM's IterationStats JSON) -> family -> kind -> value.

    waiting adds numQueuedRequests to the backend's active - scheduled: on the llmapi model the
    requests beyond the batch wait in the LLM API's queue (its execute() returns at once), where
    on the engine contract they wait in Triton's scheduler. No kvCacheStats: no KV-cache values."""
    batching = stats.get("inflightBatchingStats") or {}
    active, scheduled = _count(stats, "numActiveRequests"), _count(batching, "numScheduledRequests")
    out = {
        REQUEST_METRICS: {
            "active": active,
            "max": _count(stats, "maxNumActiveRequests"),
            "scheduled": scheduled,
            "context": _count(batching, "numContextRequests"),
            "waiting": _count(stats, "numQueuedRequests") + max(active - scheduled, 0.0),
        }
    }
    kv = stats.get("kvCacheStats")
    if isinstance(kv, Mapping):
        most, used = _count(kv, "maxNumBlocks"), _count(kv, "usedNumBlocks")
        out[KV_CACHE_BLOCK_METRICS] = {
            "max": most,
            "free": _count(kv, "freeNumBlocks"),
            "used": used,
            "tokens_per": _count(kv, "tokensPerBlock"),
            "fraction": used / most if most else 0.0,
        }
    return out


class IterationGauges:
    """The gauges of one model instance, set from the engine's iteration stats."""

    def __init__(self, pb_utils: Any, model: str, version: str) -> None:
        self.families: list[Any] = []
        labels = {"model": model, "version": version}
        self.metrics = {name: gauges(pb_utils, self.families, labels, name) for name in FAMILIES}
        self.last: dict[str, dict[str, float]] = {}

    def update(self, stats: Mapping[str, Any] | str) -> None:
        """One iteration's stats: a dict, or its JSON (the LLM API yields either, by version)."""
        values = from_iteration_stats(json.loads(stats) if isinstance(stats, str) else stats)
        self._set(values)

    def idle(self) -> None:
        """No iteration ran for a whole poll: nothing is active, queued or holding KV blocks
        (TensorRT-LLM's executor loop runs iterations only while it has requests), though the last
        iteration's stats, taken with its requests still in it, said otherwise."""
        requests = self.last.get(REQUEST_METRICS, {})
        idle = {REQUEST_METRICS: {**dict.fromkeys(REQUEST_TYPES, 0.0), "max": requests.get("max", 0.0)}}
        if blocks := self.last.get(KV_CACHE_BLOCK_METRICS):
            idle[KV_CACHE_BLOCK_METRICS] = {**blocks, "free": blocks["max"], "used": 0.0, "fraction": 0.0}
        self._set(idle)

    def _set(self, values: dict[str, dict[str, float]]) -> None:
        for name, kinds in values.items():
            for kind, value in kinds.items():
                self.metrics[name][kind].set(value)
            self.last[name] = kinds
