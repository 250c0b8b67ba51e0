"""Runtime profiles: the documented defaults for every serving knob the spec leaves unset.

Explicit values are always rendered into config.pbtxt, so a TensorRT-LLM upgrade that moves a
backend default cannot silently change how a deployment batches or caches (docs/runtime.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from llm_operator.api.v1alpha1 import BatchingStrategy, Profile, SchedulerPolicy


@dataclass(frozen=True)
class ProfileDefaults:
    strategy: BatchingStrategy
    max_queue_delay_microseconds: int
    max_queue_size: int  # 0: unbounded
    scheduler_policy: SchedulerPolicy
    kv_cache_free_gpu_memory_percent: int
    block_reuse: bool
    chunked_context: bool
    tokenizer_instances: int


PROFILES: dict[Profile, ProfileDefaults] = {
    # First token fast: no batching delay, admitted requests are never evicted, bounded queue.
    Profile.LATENCY: ProfileDefaults(
        BatchingStrategy.INFLIGHT_FUSED, 0, 256, SchedulerPolicy.GUARANTEED_NO_EVICT, 85, True, False, 2
    ),
    Profile.BALANCED: ProfileDefaults(
        BatchingStrategy.INFLIGHT_FUSED, 500, 1024, SchedulerPolicy.GUARANTEED_NO_EVICT, 90, True, True, 2
    ),
    # Tokens per GPU-second: wait to fill batches, pack the KV cache, chunk long prompts.
    Profile.THROUGHPUT: ProfileDefaults(
        BatchingStrategy.INFLIGHT_FUSED, 2000, 0, SchedulerPolicy.MAX_UTILIZATION, 95, True, True, 4
    ),
}

GPT_MODEL_TYPE = {
    BatchingStrategy.INFLIGHT_FUSED: "inflight_fused_batching",
    BatchingStrategy.INFLIGHT: "inflight_batching",
    BatchingStrategy.STATIC: "V1",
}
SCHEDULER_POLICY = {
    SchedulerPolicy.GUARANTEED_NO_EVICT: "guaranteed_no_evict",
    SchedulerPolicy.MAX_UTILIZATION: "max_utilization",
}
