"""Upstream's names, pinned: what Triton's TensorRT-LLM model files of the default release declare,
for tests/unit/test_upstream_names.py to hold the rendered repositories against.

Source: NVIDIA/TensorRT-LLM at tag v1.1.0 (releases.DEFAULT: NGC 25.12, Triton 2.64.0):
- triton_backend/all_models/inflight_batcher_llm/{ensemble,preprocessing,tensorrt_llm,
  postprocessing}/config.pbtxt
- triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt and 1/model.yaml
- tensorrt_llm/llmapi/llm_args.py (the keyword arguments of tensorrt_llm.LLM that model.yaml holds)
Read from the stored copies of those files (commits 2a9abd95 ensemble, 08dc37e3 preprocessing,
0c8de69a tensorrt_llm, 89fd9b74 postprocessing, 0a710573 llmapi config.pbtxt, 0ebb1536 model.yaml;
the copies available here, not resolved to the tag's own commit: re-check with
`git show v1.1.0:<path>` when the tag's tree is at hand). Names only: tensor names with their data
types (`None`: the type is a template variable upstream), the `parameters` keys, model.yaml keys.
"""

from __future__ import annotations

# input name -> (data type, optional)
Inputs = dict[str, tuple[str | None, bool]]
Outputs = dict[str, str | None]

ENSEMBLE_INPUTS: Inputs = {
    "text_input": ("TYPE_STRING", False),
    "decoder_text_input": ("TYPE_STRING", True),
    "max_tokens": ("TYPE_INT32", False),
    "num_return_sequences": ("TYPE_INT32", True),
    "bad_words": ("TYPE_STRING", True),
    "stop_words": ("TYPE_STRING", True),
    "exclude_input_in_output": ("TYPE_BOOL", True),
    "end_id": ("TYPE_INT32", True),
    "pad_id": ("TYPE_INT32", True),
    "top_k": ("TYPE_INT32", True),
    "top_p": ("TYPE_FP32", True),
    "temperature": ("TYPE_FP32", True),
    "length_penalty": ("TYPE_FP32", True),
    "repetition_penalty": ("TYPE_FP32", True),
    "min_tokens": ("TYPE_INT32", True),
    "presence_penalty": ("TYPE_FP32", True),
    "frequency_penalty": ("TYPE_FP32", True),
    "seed": ("TYPE_UINT64", True),
    "return_log_probs": ("TYPE_BOOL", True),
    "return_context_logits": ("TYPE_BOOL", True),
    "return_generation_logits": ("TYPE_BOOL", True),
    "return_perf_metrics": ("TYPE_BOOL", True),
    "return_num_input_tokens": ("TYPE_BOOL", True),
    "return_num_output_tokens": ("TYPE_BOOL", True),
    "beam_width": ("TYPE_INT32", True),
    "stream": ("TYPE_BOOL", True),
    "prompt_embedding_table": ("TYPE_FP16", True),
    "prompt_table_extra_id": ("TYPE_UINT64", True),
    "prompt_vocab_size": ("TYPE_INT32", True),
    "embedding_bias_words": ("TYPE_STRING", True),
    "embedding_bias_weights": ("TYPE_FP32", True),
    "lora_task_id": ("TYPE_UINT64", True),
    "lora_weights": ("TYPE_FP16", True),
    "lora_config": ("TYPE_INT32", True),
    "guided_decoding_guide_type": ("TYPE_STRING", True),
    "guided_decoding_guide": ("TYPE_STRING", True),
}
ENSEMBLE_OUTPUTS: Outputs = {
    "text_output": "TYPE_STRING",
    "cum_log_probs": "TYPE_FP32",
    "output_log_probs": "TYPE_FP32",
    "context_logits": None,
    "generation_logits": None,
    "batch_index": "TYPE_INT32",
    "sequence_index": "TYPE_INT32",
    "kv_cache_alloc_new_blocks": "TYPE_INT32",
    "kv_cache_reused_blocks": "TYPE_INT32",
    "kv_cache_alloc_total_blocks": "TYPE_INT32",
    "arrival_time_ns": "TYPE_INT64",
    "first_scheduled_time_ns": "TYPE_INT64",
    "first_token_time_ns": "TYPE_INT64",
    "last_token_time_ns": "TYPE_INT64",
    "acceptance_rate": "TYPE_FP32",
    "total_accepted_draft_tokens": "TYPE_INT32",
    "total_draft_tokens": "TYPE_INT32",
    "num_input_tokens": "TYPE_INT32",
    "num_output_tokens": "TYPE_INT32",
}

PREPROCESSING_INPUTS: Inputs = {
    "QUERY": ("TYPE_STRING", False),
    "DECODER_QUERY": ("TYPE_STRING", True),
    "IMAGE_BYTES": ("TYPE_UINT8", True),
    "IMAGE_URL": ("TYPE_STRING", True),
    "IMAGES": ("TYPE_STRING", True),
    "VIDEO_BYTES": ("TYPE_UINT8", True),
    "REQUEST_OUTPUT_LEN": ("TYPE_INT32", False),
    "BAD_WORDS_DICT": ("TYPE_STRING", True),
    "STOP_WORDS_DICT": ("TYPE_STRING", True),
    "EMBEDDING_BIAS_WORDS": ("TYPE_STRING", True),
    "EMBEDDING_BIAS_WEIGHTS": ("TYPE_FP32", True),
    "END_ID": ("TYPE_INT32", True),
    "PAD_ID": ("TYPE_INT32", True),
    "PROMPT_TABLE_EXTRA_ID": ("TYPE_UINT64", True),
}
PREPROCESSING_OUTPUTS: Outputs = {
    "INPUT_ID": "TYPE_INT32",
    "REQUEST_INPUT_LEN": "TYPE_INT32",
    "DECODER_INPUT_ID": "TYPE_INT32",
    "REQUEST_DECODER_INPUT_LEN": "TYPE_INT32",
    "BAD_WORDS_IDS": "TYPE_INT32",
    "STOP_WORDS_IDS": "TYPE_INT32",
    "EMBEDDING_BIAS": "TYPE_FP32",
    "REQUEST_OUTPUT_LEN": "TYPE_INT32",
    "OUT_END_ID": "TYPE_INT32",
    "OUT_PAD_ID": "TYPE_INT32",
    "OUT_PROMPT_TABLE_EXTRA_IDS": "TYPE_UINT64",
    "PIXEL_VALUES": "TYPE_FP16",
    "ASPECT_RATIO_IDS": "TYPE_INT64",
    "ASPECT_RATIO_MASK": "TYPE_INT64",
    "CROSS_ATTENTION_MASK": "TYPE_INT64",
    "IMAGE_SIZES": "TYPE_INT64",
    "IS_VIDEO_INPUT": "TYPE_BOOL",
    "ATTENTION_MASK": "TYPE_INT64",
    "IMAGE_GRID_THW": "TYPE_INT64",
    "VISION_INPUT_ID": "TYPE_INT32",
}
PREPROCESSING_PARAMETERS = frozenset(
    {"tokenizer_dir", "add_special_tokens", "multimodal_model_path", "gpt_model_path", "max_num_images",
     "hf_model_path"}
)  # fmt: skip

TENSORRT_LLM_INPUTS: Inputs = {
    "input_ids": ("TYPE_INT32", True),
    "encoder_input_features": (None, True),
    "encoder_output_lengths": ("TYPE_INT32", True),
    "input_lengths": ("TYPE_INT32", False),
    "request_output_len": ("TYPE_INT32", False),
    "num_return_sequences": ("TYPE_INT32", True),
    "draft_input_ids": ("TYPE_INT32", True),
    "decoder_input_ids": ("TYPE_INT32", True),
    "decoder_input_lengths": ("TYPE_INT32", True),
    "draft_logits": (None, True),
    "draft_acceptance_threshold": ("TYPE_FP32", True),
    "end_id": ("TYPE_INT32", True),
    "pad_id": ("TYPE_INT32", True),
    "stop_words_list": ("TYPE_INT32", True),
    "bad_words_list": ("TYPE_INT32", True),
    "embedding_bias": ("TYPE_FP32", True),
    "beam_width": ("TYPE_INT32", True),
    "temperature": ("TYPE_FP32", True),
    "runtime_top_k": ("TYPE_INT32", True),
    "runtime_top_p": ("TYPE_FP32", True),
    "runtime_top_p_min": ("TYPE_FP32", True),
    "runtime_top_p_decay": ("TYPE_FP32", True),
    "runtime_top_p_reset_ids": ("TYPE_INT32", True),
    "len_penalty": ("TYPE_FP32", True),
    "early_stopping": ("TYPE_BOOL", True),
    "repetition_penalty": ("TYPE_FP32", True),
    "min_tokens": ("TYPE_INT32", True),
    "beam_search_diversity_rate": ("TYPE_FP32", True),
    "presence_penalty": ("TYPE_FP32", True),
    "frequency_penalty": ("TYPE_FP32", True),
    "seed": ("TYPE_UINT64", True),
    "return_log_probs": ("TYPE_BOOL", True),
    "return_context_logits": ("TYPE_BOOL", True),
    "return_generation_logits": ("TYPE_BOOL", True),
    "return_perf_metrics": ("TYPE_BOOL", True),
    "return_num_input_tokens": ("TYPE_BOOL", True),
    "return_num_output_tokens": ("TYPE_BOOL", True),
    "exclude_input_in_output": ("TYPE_BOOL", True),
    "stop": ("TYPE_BOOL", True),
    "streaming": ("TYPE_BOOL", True),
    "prompt_embedding_table": (None, True),
    "prompt_table_extra_ids": ("TYPE_UINT64", True),
    "prompt_vocab_size": ("TYPE_INT32", True),
    "cross_attention_mask": ("TYPE_BOOL", True),
    "mrope_rotary_cos_sin": ("TYPE_FP32", True),
    "mrope_position_deltas": ("TYPE_INT64", True),
    "lora_task_id": ("TYPE_UINT64", True),
    "lora_weights": ("TYPE_FP16", True),
    "lora_config": ("TYPE_INT32", True),
    "context_phase_params": ("TYPE_UINT8", True),
    "skip_cross_attn_blocks": ("TYPE_BOOL", True),
    "retention_token_range_starts": ("TYPE_INT32", True),
    "retention_token_range_ends": ("TYPE_INT32", True),
    "retention_token_range_priorities": ("TYPE_INT32", True),
    "retention_token_range_durations_ms": ("TYPE_INT32", True),
    "retention_decode_priority": ("TYPE_INT32", True),
    "retention_decode_duration_ms": ("TYPE_INT32", True),
    "guided_decoding_guide_type": ("TYPE_STRING", True),
    "guided_decoding_guide": ("TYPE_STRING", True),
    "lookahead_window_size": ("TYPE_INT32", True),
    "lookahead_ngram_size": ("TYPE_INT32", True),
    "lookahead_verification_set_size": ("TYPE_INT32", True),
}
TENSORRT_LLM_OUTPUTS: Outputs = {
    "output_ids": "TYPE_INT32",
    "sequence_length": "TYPE_INT32",
    "cum_log_probs": "TYPE_FP32",
    "output_log_probs": "TYPE_FP32",
    "context_logits": None,
    "generation_logits": None,
    "batch_index": "TYPE_INT32",
    "sequence_index": "TYPE_INT32",
    "context_phase_params": "TYPE_UINT8",
    "kv_cache_alloc_new_blocks": "TYPE_INT32",
    "kv_cache_reused_blocks": "TYPE_INT32",
    "kv_cache_alloc_total_blocks": "TYPE_INT32",
    "arrival_time_ns": "TYPE_INT64",
    "first_scheduled_time_ns": "TYPE_INT64",
    "first_token_time_ns": "TYPE_INT64",
    "last_token_time_ns": "TYPE_INT64",
    "acceptance_rate": "TYPE_FP32",
    "total_accepted_draft_tokens": "TYPE_INT32",
    "total_draft_tokens": "TYPE_INT32",
    "num_input_tokens": "TYPE_INT32",
    "num_output_tokens": "TYPE_INT32",
}
TENSORRT_LLM_PARAMETERS = frozenset(
    {"max_beam_width", "FORCE_CPU_ONLY_INPUT_TENSORS", "gpt_model_type", "gpt_model_path",
     "encoder_model_path", "max_tokens_in_paged_kv_cache", "max_attention_window_size",
     "sink_token_length", "batch_scheduler_policy", "kv_cache_free_gpu_mem_fraction",
     "cross_kv_cache_fraction", "kv_cache_host_memory_bytes", "kv_cache_onboard_blocks",
     "enable_trt_overlap", "exclude_input_in_output", "cancellation_check_period_ms",
     "stats_check_period_ms", "iter_stats_max_iterations", "request_stats_max_iterations",
     "enable_kv_cache_reuse", "normalize_log_probs", "enable_chunked_context", "gpu_device_ids",
     "participant_ids", "num_nodes", "lora_cache_optimal_adapter_size", "lora_cache_max_adapter_size",
     "lora_cache_gpu_memory_fraction", "lora_cache_host_memory_bytes", "lora_prefetch_dir",
     "decoding_mode", "executor_worker_path", "lookahead_window_size", "lookahead_ngram_size",
     "lookahead_verification_set_size", "medusa_choices", "eagle_choices", "gpu_weights_percent",
     "enable_context_fmha_fp32_acc", "multi_block_mode", "cuda_graph_mode", "cuda_graph_cache_size",
     "speculative_decoding_fast_logits", "tokenizer_dir", "guided_decoding_backend",
     "xgrammar_tokenizer_info_path"}
)  # fmt: skip
# What the C++ backend cannot start without (its model_instance_state reads them unconditionally:
# ModelState::GetParameter throws "Cannot find parameter with name" for one that is missing).
# getGuidedDecodingConfigFromParams reads the last three outside any try (triton_backend/
# inflight_batcher_llm/src/model_instance_state.cc, in each of three stored copies, 0c8de69a among
# them; tensorrtllm_backend's own copy at its tag v0.19.0 the same).
TENSORRT_LLM_REQUIRED_PARAMETERS = frozenset(
    {"gpt_model_type", "gpt_model_path", "tokenizer_dir", "guided_decoding_backend",
     "xgrammar_tokenizer_info_path"}
)  # fmt: skip

# Guided decoding on the C++ backend. model_instance_state.cc getGuidedDecodingConfigFromParams:
# `guided_decoding_backend` "xgrammar" (anything else throws) with `xgrammar_tokenizer_info_path`, a
# JSON file it must find (TLLM_CHECK "Xgrammar's tokenizer info path at %s does not exist") holding
# these keys; either parameter empty: no guided decoder. tokenizer_dir is read and not used there.
GUIDED_DECODING_BACKENDS = frozenset({"xgrammar"})
XGRAMMAR_TOKENIZER_INFO_KEYS = frozenset({"encoded_vocab", "tokenizer_str", "stop_token_ids"})
# The file, as examples/generate_xgrammar_tokenizer_info.py (stored copy 7ed07f06; options in
# tests/unit/upstream/trtllm-v1.1.0-converters.yaml) names it in its --output_dir; the script under
# examples/ is what triton-inference-server/tensorrtllm_backend docs/guided_decoding.md runs on its
# release branches r25.07 to r26.07 (read at 5419275f r25.12 and 3bc11537 r26.07), whose
# dockerfile/Dockerfile.triton.trt_llm_backend copies TensorRT-LLM's examples/ to /app/examples.
XGRAMMAR_TOKENIZER_INFO_SCRIPT = "generate_xgrammar_tokenizer_info.py"
XGRAMMAR_TOKENIZER_INFO_FILE = "xgrammar_tokenizer_info.json"
# What it writes for a fast tokenizer, in small (NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/tokenizer.py
# _xgrammar_tokenizer_info, stored copy 89fd9b74): the vocabulary in id order, the backend
# tokenizer's JSON, [eos_token_id]. A tiktoken tokenizer gets no tokenizer_str, and a tokenizer
# without an eos token a null stop id: the backend's get<> throws on either.
XGRAMMAR_TOKENIZER_INFO_EXAMPLE = {
    "encoded_vocab": ["<s>", "</s>", "\u0120a"],
    "tokenizer_str": '{"version": "1.0", "model": {"type": "BPE"}}',
    "stop_token_ids": [1],
}
# The guide types the backend maps (triton_backend/inflight_batcher_llm/src/utils.cc
# getGuidedDecodingParamsFromTensors, stored copy); any other string is dropped, unguided.
GUIDE_TYPES = frozenset({"json", "json_schema", "regex", "ebnf_grammar"})

POSTPROCESSING_INPUTS: Inputs = {
    "TOKENS_BATCH": ("TYPE_INT32", False),
    "SEQUENCE_LENGTH": ("TYPE_INT32", False),
}
POSTPROCESSING_OUTPUTS: Outputs = {"OUTPUT": "TYPE_STRING"}
POSTPROCESSING_PARAMETERS = frozenset({"tokenizer_dir", "skip_special_tokens"})

INFLIGHT_BATCHER_LLM: dict[str, tuple[Inputs, Outputs, frozenset[str]]] = {
    "ensemble": (ENSEMBLE_INPUTS, ENSEMBLE_OUTPUTS, frozenset()),
    "preprocessing": (PREPROCESSING_INPUTS, PREPROCESSING_OUTPUTS, PREPROCESSING_PARAMETERS),
    "tensorrt_llm": (TENSORRT_LLM_INPUTS, TENSORRT_LLM_OUTPUTS, TENSORRT_LLM_PARAMETERS),
    "postprocessing": (POSTPROCESSING_INPUTS, POSTPROCESSING_OUTPUTS, POSTPROCESSING_PARAMETERS),
}
# Pre/postprocessing model.py read these without a default.
REQUIRED_PARAMETERS: dict[str, frozenset[str]] = {
    "preprocessing": frozenset({"tokenizer_dir"}),
    "tensorrt_llm": TENSORRT_LLM_REQUIRED_PARAMETERS,
    "postprocessing": frozenset({"tokenizer_dir"}),
}

LLMAPI_INPUTS: Inputs = {
    "text_input": ("TYPE_STRING", False),
    "image_url": ("TYPE_STRING", True),
    "streaming": ("TYPE_BOOL", True),
    "sampling_param_best_of": ("TYPE_INT32", True),
    "sampling_param_temperature": ("TYPE_FP32", True),
    "sampling_param_top_k": ("TYPE_INT32", True),
    "sampling_param_top_p": ("TYPE_FP32", True),
    "sampling_param_frequency_penalty": ("TYPE_FP32", True),
    "sampling_param_presence_penalty": ("TYPE_FP32", True),
    "sampling_param_max_tokens": ("TYPE_INT32", True),
    "sampling_param_stop": ("TYPE_STRING", True),
    "sampling_param_seed": ("TYPE_UINT64", True),
    "sampling_param_exclude_input_from_output": ("TYPE_BOOL", True),
    "sampling_param_return_perf_metrics": ("TYPE_BOOL", True),
    "return_finish_reason": ("TYPE_BOOL", True),
    "return_stop_reason": ("TYPE_BOOL", True),
    "return_cumulative_logprob": ("TYPE_BOOL", True),
    "stop": ("TYPE_BOOL", True),
    "lora_id": ("TYPE_UINT64", True),
    "lora_name": ("TYPE_STRING", True),
    "lora_path": ("TYPE_STRING", True),
    "lora_ckpt_source": ("TYPE_STRING", True),
}
LLMAPI_OUTPUTS: Outputs = {
    "text_output": "TYPE_STRING",
    "finish_reason": "TYPE_STRING",
    "stop_reason": "TYPE_STRING",
    "cumulative_logprob": "TYPE_FP32",
    "kv_cache_reused_block": "TYPE_INT32",
    "kv_cache_missed_block": "TYPE_INT32",
    "kv_cache_alloc_new_blocks": "TYPE_INT32",
    "kv_cache_alloc_total_blocks": "TYPE_INT32",
    "kv_cache_hit_rate": "TYPE_FP32",
    "arrival_time_ns": "TYPE_INT64",
    "first_scheduled_time_ns": "TYPE_INT64",
    "first_token_time_ns": "TYPE_INT64",
    "last_token_time_ns": "TYPE_INT64",
    "acceptance_rate": "TYPE_FP32",
    "total_accepted_draft_tokens": "TYPE_INT32",
    "total_draft_tokens": "TYPE_INT32",
}
# model.py's own parameters (read with a default): gpu_device_ids (multi-instance only).
LLMAPI_PARAMETERS = frozenset({"gpu_device_ids"})

# llmapi/tensorrt_llm/1/model.yaml: every top-level key upstream writes, and triton_config's keys
# (model.py indexes max_batch_size and decoupled without a default; cancellation_check_period_ms is
# read when present).
MODEL_YAML_KEYS = frozenset(
    {"model", "backend", "tensor_parallel_size", "pipeline_parallel_size", "triton_config"}
)
TRITON_CONFIG_REQUIRED = frozenset({"max_batch_size", "decoupled"})
TRITON_CONFIG_KEYS = TRITON_CONFIG_REQUIRED | {"cancellation_check_period_ms"}
# tensorrt_llm/llmapi/llm_args.py: the LLM arguments model.yaml may add (the ones the operator sets),
# and KvCacheConfig's fields it sets.
LLM_ARGS = frozenset(
    {"model", "tokenizer", "revision", "backend", "dtype", "tensor_parallel_size",
     "pipeline_parallel_size", "max_batch_size", "max_seq_len", "max_num_tokens", "max_input_len",
     "max_beam_width", "enable_chunked_prefill", "kv_cache_config", "trust_remote_code",
     "enable_iter_perf_stats", "guided_decoding_backend"}
)  # fmt: skip
KV_CACHE_CONFIG = frozenset(
    {"free_gpu_memory_fraction", "enable_block_reuse", "max_tokens", "host_cache_size", "dtype"}
)

# The pytorch backend across pods (runtime/commands.py): TensorRT-LLM's multi-node launcher of the
# LLM API, which the tensorrt_llm wheel installs on PATH (setup.py `scripts=`) and Triton's llmapi
# docs run on every rank (tensorrtllm_backend docs/llmapi.md at r25.12 5419275f and r26.07
# 3bc11537: `srun ... trtllm-llmapi-launch /opt/tritonserver/bin/tritonserver --model-repository
# ...`). Read from the stored copies of tensorrt_llm/llmapi/trtllm-llmapi-launch (020c89e6),
# mgmn_worker_node.py (8f91cff2), mgmn_leader_node.py (1033ea16) and setup.py (004da3c2), not
# resolved to the v1.1.0 / v1.2.1 tags (re-check with `git show <tag>:<path>`): rank 0 (the rank
# variables below, Slurm's first) runs the given command and the MPI session server
# (LLMAPI_LEADER_MODULE), every other rank LLMAPI_WORKER_MODULE (an mpi4py MPICommExecutor).
LLMAPI_LAUNCH = "trtllm-llmapi-launch"
LLMAPI_LAUNCH_RANK = ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK")
LLMAPI_LAUNCH_WORLD = ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")
# What the script exports itself for the LLM API in the command (tensorrt_llm/executor/utils.py).
LLMAPI_LAUNCH_SETS = (
    "TLLM_SPAWN_PROXY_PROCESS", "TLLM_SPAWN_PROXY_PROCESS_IPC_ADDR", "TLLM_SPAWN_PROXY_PROCESS_IPC_HMAC_KEY"
)  # fmt: skip
LLMAPI_LEADER_MODULE = "tensorrt_llm.llmapi.mgmn_leader_node"
LLMAPI_WORKER_MODULE = "tensorrt_llm.llmapi.mgmn_worker_node"

# What the operator's wrapper (runtime/llmapi_model.py) relies on in the llmapi model.py
# (triton_backend/all_models/llmapi/tensorrt_llm/1/model.py, stored copy 044a90d2, newer than
# v1.2.1; its _init_engine / _run_llm_engine set both attributes on rank 0 before initialize()
# returns), and the LLM's stats method (tensorrt_llm/llmapi/llm.py: get_stats_async(timeout) ->
# executor aget_stats -> tensorrt_llm/executor/result.py IterationResult, one json.loads'd dict
# per iteration, ending after `timeout` seconds without one, and at once until a new request when
# drained; the stored copies, not resolved to a tag: re-check at v1.1.0 and v1.2.1).
LLMAPI_MODEL_CLASS = "TritonPythonModel"
LLMAPI_MODEL_METHODS = ("initialize", "finalize")
# What the wrapper overrides for guided decoding, n and log probabilities (runtime/
# llmapi_structured.py), by the stored model.py's signatures: _convert_request(request) returns
# (prompt, sampling_params, streaming, output_config), _execute_single_request calling
# `SamplingParams(**sampling_params)` and `_create_response(request_output=, output_config=)`.
LLMAPI_MODEL_OVERRIDES = {
    "_convert_request": ("self", "request"),
    "_create_response": ("self", "request_output", "output_config"),
}
LLMAPI_CONVERT_REQUEST_RETURNS = ("prompt", "sampling_params", "streaming", "output_config")
# The LLM API's names the overrides use (tensorrt_llm/sampling_params.py, stored copy 000a01de):
# SamplingParams' keywords, GuidedDecodingParams' fields, CompletionOutput's fields read.
SAMPLING_PARAMS = frozenset({"n", "logprobs", "guided_decoding"})
GUIDED_DECODING_PARAMS = frozenset({"json", "regex", "grammar", "json_object", "structural_tag"})
COMPLETION_OUTPUT = frozenset({"token_ids", "logprobs"})
# The wrapper's own inputs and outputs, declared after upstream's in the llmapi config.pbtxt:
# the engine contract's names and types where it has one (TENSORRT_LLM_INPUTS/OUTPUTS).
LLMAPI_WRAPPER_INPUTS: Inputs = {
    "guided_decoding_guide_type": ("TYPE_STRING", True),
    "guided_decoding_guide": ("TYPE_STRING", True),
    "sampling_param_n": ("TYPE_INT32", True),
    "sampling_param_logprobs": ("TYPE_INT32", True),
}
LLMAPI_WRAPPER_OUTPUTS: Outputs = {
    "output_ids": "TYPE_INT32",
    "output_log_probs": "TYPE_FP32",
    "top_logprob_ids": "TYPE_INT32",
    "top_logprobs": "TYPE_FP32",
}
LLMAPI_MODEL_ATTRIBUTES = ("_llm_engine", "_event_loop")
LLM_STATS_METHOD = "get_stats_async"
# IterationStats as TensorRT-LLM serializes it (cpp/tensorrt_llm/executor/jsonSerialization.cpp,
# NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE of IterationStats, InflightBatchingStats, KvCacheStats): the
# fields the gauges read. The C++ backend builds its gauges from the same fields
# (triton_backend/inflight_batcher_llm/src/model_instance_state.cc: "Waiting Requests" is
# numActiveRequests - numScheduledRequests; custom_metrics_reporter.cc names the families).
ITERATION_STATS = frozenset({"numActiveRequests", "numQueuedRequests", "maxNumActiveRequests"})
INFLIGHT_BATCHING_STATS = frozenset({"numScheduledRequests", "numContextRequests"})
KV_CACHE_STATS = frozenset({"maxNumBlocks", "freeNumBlocks", "usedNumBlocks", "tokensPerBlock"})
