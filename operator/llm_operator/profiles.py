"""Runtime profiles: the documented default of every serving knob the spec leaves unset.

This table is the single source of those defaults (docs/runtime.md shows it; a unit test keeps the
two equal). Every value is rendered explicitly into config.pbtxt, so a TensorRT-LLM upgrade that
moves a backend default cannot silently change how a deployment batches, queues or caches.
"""

from __future__ import annotations

from dataclasses import dataclass

from llm_operator.api.v1alpha1 import BatchingStrategy, Profile, SchedulerPolicy


@dataclass(frozen=True)
class ProfileDefaults:
    batching_strategy: BatchingStrategy
    max_queue_delay_microseconds: int  # Triton dynamic batcher: wait this long to co-schedule requests
    max_queue_size: int  # the engine's queue (tensorrt_llm): beyond it requests are rejected at once
    scheduler_policy: SchedulerPolicy
    kv_cache_free_gpu_memory_percent: int  # of the memory left after weights and activations
    kv_cache_reuse: bool  # prefix caching
    chunked_context: bool
    preprocessing_instances: int  # tokenizer processes
    postprocessing_instances: int  # detokenizer processes
    cpu_model_instances: int  # cpu-reference: concurrently executing batches
    cancellation_check_period_ms: int
    stats_check_period_ms: int  # also how often nv_trt_llm_* metrics refresh


PROFILES: dict[Profile, ProfileDefaults] = {
    # Time to first token: no batching delay, a short queue that sheds load early (the autoscaler
    # sees it), admitted requests never evicted, prompts prefilled in one piece.
    Profile.LATENCY: ProfileDefaults(
        batching_strategy=BatchingStrategy.INFLIGHT_FUSED,
        max_queue_delay_microseconds=0,
        max_queue_size=128,
        scheduler_policy=SchedulerPolicy.GUARANTEED_NO_EVICT,
        kv_cache_free_gpu_memory_percent=85,
        kv_cache_reuse=True,
        chunked_context=False,
        preprocessing_instances=4,
        postprocessing_instances=4,
        cpu_model_instances=2,
        cancellation_check_period_ms=100,
        stats_check_period_ms=100,
    ),
    # TensorRT-LLM's own defaults where they are sensible, a short co-scheduling window.
    Profile.BALANCED: ProfileDefaults(
        batching_strategy=BatchingStrategy.INFLIGHT_FUSED,
        max_queue_delay_microseconds=500,
        max_queue_size=1024,
        scheduler_policy=SchedulerPolicy.GUARANTEED_NO_EVICT,
        kv_cache_free_gpu_memory_percent=90,
        kv_cache_reuse=True,
        chunked_context=True,
        preprocessing_instances=2,
        postprocessing_instances=2,
        cpu_model_instances=1,
        cancellation_check_period_ms=100,
        stats_check_period_ms=100,
    ),
    # Tokens per GPU-second: wait to fill batches, pack the KV cache (max_utilization may pause
    # requests when it runs out), chunk long prompts so decoding never stalls behind them.
    Profile.THROUGHPUT: ProfileDefaults(
        batching_strategy=BatchingStrategy.INFLIGHT_FUSED,
        max_queue_delay_microseconds=2000,
        max_queue_size=4096,
        scheduler_policy=SchedulerPolicy.MAX_UTILIZATION,
        kv_cache_free_gpu_memory_percent=95,
        kv_cache_reuse=True,
        chunked_context=True,
        preprocessing_instances=4,
        postprocessing_instances=4,
        cpu_model_instances=1,
        cancellation_check_period_ms=100,
        stats_check_period_ms=100,
    ),
}

# Spec enum -> the tensorrt_llm backend's parameter value.
GPT_MODEL_TYPE = {
    BatchingStrategy.INFLIGHT_FUSED: "inflight_fused_batching",
    BatchingStrategy.INFLIGHT: "inflight_batching",
    BatchingStrategy.STATIC: "V1",
}
SCHEDULER_POLICY = {
    SchedulerPolicy.GUARANTEED_NO_EVICT: "guaranteed_no_evict",
    SchedulerPolicy.MAX_UTILIZATION: "max_utilization",
}
