"""The Triton model repository: rendered from the Jinja2 templates in model_repo_templates/ (package data,
read with importlib.resources), carried to the pods in a ConfigMap (keys encoded by
runtime/repository.py), materialized by the launcher into the directory tritonserver loads.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from importlib.resources.abc import Traversable
from typing import TypeVar

import jinja2

from llm_operator.api.v1alpha1 import Backend, CpuContract, CpuReferenceSpec, LLMDeploymentSpec, Precision
from llm_operator.contract import XGRAMMAR_TOKENIZER_INFO
from llm_operator.plan.types import PoolPlan
from llm_operator.profiles import GPT_MODEL_TYPE, PROFILES, SCHEDULER_POLICY, ProfileDefaults
from llm_operator.runtime.cpu_reference import BUILTIN_MODELS
from llm_operator.runtime.repository import configmap_key

TRTLLM_MODELS = ("preprocessing", "tensorrt_llm", "postprocessing", "ensemble")
# The CPU runtime's engine contract: the one decoder, and the text ensemble around it for /v2.
CPU_ENGINE_MODELS = {
    "tensorrt_llm": resources.files("llm_operator.runtime.cpu_reference") / "model.py",
    "ensemble": resources.files("llm_operator.runtime.cpu_reference") / "ensemble.py",
}
# The LLM API's dtype names (tensorrt_llm.llmapi.LlmArgs.dtype) of the precisions the pytorch
# backend serves (admission refuses the others).
LLMAPI_DTYPE = {Precision.FP16: "float16", Precision.BF16: "bfloat16"}
# trtllm-build's default logits dtype; the engine builder does not change it.
LOGITS_DATATYPE = "TYPE_FP32"
# Where the CPU runtime image (images/cpu-runtime.Dockerfile) has the model's own package (first:
# the launcher's injected copy of llm_operator, on PYTHONPATH, has no cpu_reference/) and torch
# and numpy.
CPU_RUNTIME_PYTHON_PATH = ("/opt/llm-operator/cpu-reference", "/usr/local/lib/python3.11/site-packages")
# The llmapi model of either runtime: the operator's wrapper (model.py) with the gauges and the
# structured outputs' inputs and outputs beside it,
# over base_model.py (NVIDIA's model.py, which the launcher copies from the serving image, or the CPU
# runtime's, shipped here).
LLMAPI_MODEL_FILES = {
    "tensorrt_llm/1/model.py": resources.files("llm_operator.runtime") / "llmapi_model.py",
    "tensorrt_llm/1/trtllm_metrics.py": resources.files("llm_operator.runtime") / "trtllm_metrics.py",
    "tensorrt_llm/1/llmapi_structured.py": resources.files("llm_operator.runtime") / "llmapi_structured.py",
}
CPU_LLMAPI_BASE_PY = resources.files("llm_operator.runtime.cpu_reference") / "llmapi.py"
# nv_inference_first_response_histogram_ms's buckets in Triton's core (metric_model_reporter.h).
TTFT_DEFAULT_BUCKETS_MS = (100, 500, 2000, 5000)

T = TypeVar("T")


# Read as package data: one location for a checkout, the wheel and every image, with no path to
# configure. `templates` is a symlink to the top-level model_repo_templates/, which the wheel build
# copies in (templates looked up beside the package were missing after `pip install`).
TEMPLATES = resources.files(__name__) / "templates"


def _template_source(name: str) -> tuple[str, None, Callable[[], bool]]:
    # Package data does not change under a running process: compiled once, never reloaded.
    return (TEMPLATES / name).read_text(encoding="utf-8"), None, lambda: True


def _pbtxt_string(value: object) -> str:
    """A protobuf text-format string literal."""
    text = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{text}"'


@functools.cache
def _environment() -> jinja2.Environment:
    """One environment per process: Jinja caches compiled templates per environment, and compiling
    them again on every reconcile cost ~28 ms of the operator's CPU each time."""
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(_template_source),
        undefined=jinja2.StrictUndefined,  # a missing value fails rendering, never renders empty
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["q"] = _pbtxt_string
    return env


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _pick(explicit: T | None, default: T) -> T:
    return default if explicit is None else explicit


def ttft_budget_ms(spec: LLMDeploymentSpec) -> int | None:
    """The canary analysis's time-to-first-token budget, if any."""
    analysis = spec.rollout.canary.analysis if spec.rollout.canary else None
    return analysis.max_time_to_first_token_milliseconds if analysis else None


def ttft_buckets_ms(spec: LLMDeploymentSpec) -> list[int]:
    """Bucket edges of nv_inference_first_response_histogram_ms: Triton's defaults plus, with a
    budget, an edge exactly at it (so "p99 within budget" is exact: rollout/queries.py) and one at
    twice it (histogram_quantile reports a quantile in the +Inf bucket as the highest finite edge,
    which must then lie above the budget)."""
    budget = ttft_budget_ms(spec)
    return sorted({*TTFT_DEFAULT_BUCKETS_MS, *((budget, 2 * budget) if budget else ())})


def _common(spec: LLMDeploymentSpec, profile: ProfileDefaults) -> dict[str, object]:
    batching = spec.runtime.batching
    return {
        "ttft_budget_ms": ttft_budget_ms(spec),
        "ttft_buckets_ms": ", ".join(str(b) for b in ttft_buckets_ms(spec)),
        "max_batch_size": spec.engine.max_batch_size,
        "decoupled": _flag(spec.runtime.streaming),
        "max_queue_delay_microseconds": _pick(
            batching.max_queue_delay_microseconds, profile.max_queue_delay_microseconds
        ),
        "max_queue_size": _pick(batching.max_queue_size, profile.max_queue_size),
        "exclude_input_in_output": _flag(spec.runtime.exclude_input_in_output),
    }


def trtllm_values(
    spec: LLMDeploymentSpec, pool: PoolPlan, engine_dir: str, tokenizer_dir: str
) -> dict[str, object]:
    """What the inflight_batcher_llm templates render: the spec's value, else the profile's."""
    runtime, engine = spec.runtime, spec.engine
    profile = PROFILES[runtime.profile]
    kv = runtime.kv_cache
    percent = _pick(kv.free_gpu_memory_percent, profile.kv_cache_free_gpu_memory_percent)
    return {
        **_common(spec, profile),
        "gpt_model_type": GPT_MODEL_TYPE[_pick(runtime.batching.strategy, profile.batching_strategy)],
        "engine_dir": engine_dir,
        "tokenizer_dir": tokenizer_dir,
        "xgrammar_tokenizer_info_path": f"{engine_dir}/{XGRAMMAR_TOKENIZER_INFO}",  # engine/build.py's
        "max_beam_width": engine.max_beam_width,
        "decoding_mode": "beam_search" if engine.max_beam_width > 1 else "top_k_top_p",
        "batch_scheduler_policy": SCHEDULER_POLICY[
            _pick(runtime.batching.scheduler_policy, profile.scheduler_policy)
        ],
        "kv_cache_free_gpu_mem_fraction": f"{percent / 100:g}",
        # Unset: as many tokens as the engine can ever hold at once, i.e. no cap below the fraction.
        "max_tokens_in_paged_kv_cache": _pick(
            kv.max_tokens, engine.max_batch_size * engine.max_seq_len * engine.max_beam_width
        ),
        "max_attention_window_size": engine.max_seq_len,  # full attention
        "kv_cache_host_memory_bytes": _pick(kv.host_memory_bytes, 0),
        "enable_kv_cache_reuse": _flag(_pick(kv.block_reuse, profile.kv_cache_reuse)),
        "enable_chunked_context": _flag(_pick(runtime.chunked_context, profile.chunked_context)),
        "cancellation_check_period_ms": profile.cancellation_check_period_ms,
        "stats_check_period_ms": profile.stats_check_period_ms,
        # Every rank of this pod sees the pod's GPUs; rank r uses entry r % gpusPerPod.
        "gpu_device_ids": ",".join(str(i) for i in range(pool.gpus_per_pod)),
        "logits_datatype": LOGITS_DATATYPE,
        "preprocessing_instances": profile.preprocessing_instances,
        "postprocessing_instances": profile.postprocessing_instances,
    }


def weights_seed(revision: str) -> int:
    """The builtin model's weights come from its revision: a new revision is a new model, as with
    real checkpoints."""
    return int(hashlib.sha256(revision.encode()).hexdigest()[:8], 16)


def cpu_values(spec: LLMDeploymentSpec, python_path: Sequence[str]) -> dict[str, object]:
    """What the cpu_reference template renders."""
    uri = spec.model.source.uri
    builtin = uri.startswith("builtin://")
    name = uri.removeprefix("builtin://") if builtin else ""  # else: LLMOP_MODEL_DIR's checkpoint
    if builtin and name not in BUILTIN_MODELS:
        raise ValueError(
            f"the cpu-reference backend serves builtin models "
            f"({', '.join('builtin://' + n for n in BUILTIN_MODELS)}) or checkpoints, not {uri}"
        )
    profile = PROFILES[spec.runtime.profile]
    max_input_len, max_seq_len = sequence_limits(spec)
    return {
        **_common(spec, profile),
        # Unbounded unless the spec bounds it: any queue policy turns off the prefetch of Triton's
        # dynamic batcher, so a request that arrives while every instance decodes (this model's
        # execute blocks for the whole batch) waits for the batcher's 500 ms timer instead of the
        # instance (docs/runtime.md "Queue bounds").
        "max_queue_size": _pick(spec.runtime.batching.max_queue_size, 0),
        "cpu_model_instances": profile.cpu_model_instances,
        "python_path": os.pathsep.join(python_path),
        "builtin_model": name,
        "weights_seed": weights_seed(spec.model.revision or "main"),
        "max_input_len": max_input_len,
        "max_seq_len": max_seq_len,
    }


def sequence_limits(spec: LLMDeploymentSpec) -> tuple[int, int]:
    """(maxInputLen, maxSeqLen) as the served model enforces them: a builtin model has no more
    positions than it was made with. The OpenAI front door refuses longer requests up front."""
    engine = spec.engine
    builtin = BUILTIN_MODELS.get(spec.model.source.uri.removeprefix("builtin://"))
    if engine.backend != Backend.CPU_REFERENCE or builtin is None:
        return engine.max_input_len, engine.max_seq_len
    max_seq_len = min(engine.max_seq_len, builtin.max_positions)
    return min(engine.max_input_len, max_seq_len), max_seq_len


def speaks_llmapi(spec: LLMDeploymentSpec) -> bool:
    """Whether the serving pods speak the LLM API contract: the pytorch backend, or a cpu-reference
    deployment whose CPU runtime speaks it (engine.cpuReference.contract, the default)."""
    cpu = spec.engine.cpu_reference or CpuReferenceSpec()
    return spec.engine.backend == Backend.PYTORCH or (
        spec.engine.backend == Backend.CPU_REFERENCE and cpu.contract == CpuContract.PYTORCH
    )


def _files(paths: Mapping[str, Traversable]) -> dict[str, str]:
    return {path: source.read_text(encoding="utf-8") for path, source in paths.items()}


def checkpoint(spec: LLMDeploymentSpec, model_dir: str) -> str:
    """What the LLM API loads: the model's directory in the pod (a cached s3:// or hf:// source,
    or a mounted pvc:// one), as the serving pod mounts it."""
    if not model_dir:
        raise ValueError(
            f"the pytorch backend reads its checkpoint from a directory, not {spec.model.source.uri}"
        )
    return model_dir


def llmapi_values(spec: LLMDeploymentSpec, pool: PoolPlan, model_dir: str) -> dict[str, object]:
    """What the llmapi model.yaml template renders: the spec's value, else the profile's."""
    runtime, engine = spec.runtime, spec.engine
    profile = PROFILES[runtime.profile]
    kv = runtime.kv_cache
    percent = _pick(kv.free_gpu_memory_percent, profile.kv_cache_free_gpu_memory_percent)
    return {
        "model": checkpoint(spec, model_dir),
        "dtype": LLMAPI_DTYPE[engine.precision],
        "tensor_parallel_size": pool.tensor,
        "pipeline_parallel_size": pool.pipeline,
        "max_batch_size": engine.max_batch_size,
        "max_seq_len": engine.max_seq_len,
        "max_num_tokens": engine.max_num_tokens,
        "enable_chunked_prefill": _flag(_pick(runtime.chunked_context, profile.chunked_context)),
        "free_gpu_memory_fraction": f"{percent / 100:g}",
        "enable_block_reuse": _flag(_pick(kv.block_reuse, profile.kv_cache_reuse)),
        "kv_max_tokens": kv.max_tokens,
        "decoupled": _flag(runtime.streaming),
    }


def cpu_llmapi_files(spec: LLMDeploymentSpec, python_path: Sequence[str]) -> dict[str, str]:
    """The CPU runtime on the LLM API contract: upstream's config.pbtxt, completed with what the
    llmapi model's auto_complete_config would set (the CPU runtime's Triton starts with
    --disable-auto-complete-config) and the CPU model's parameters; model.yaml with the arguments
    its engine reads; the wrapper over the CPU base model."""
    env = _environment()
    values = cpu_values(spec, python_path)
    return {
        "tensorrt_llm/config.pbtxt": env.get_template("llmapi/tensorrt_llm.pbtxt.j2").render(
            values, cpu=True
        ),
        "tensorrt_llm/1/model.yaml": env.get_template("cpu_reference/model.yaml.j2").render(values),
        **_files(LLMAPI_MODEL_FILES),
        "tensorrt_llm/1/base_model.py": CPU_LLMAPI_BASE_PY.read_text(encoding="utf-8"),
    }


def render_repository(
    spec: LLMDeploymentSpec,
    pool: PoolPlan,
    *,
    engine_dir: str,
    tokenizer_dir: str,
    python_path: Sequence[str] = CPU_RUNTIME_PYTHON_PATH,
    model_dir: str = "",
) -> dict[str, str]:
    """Relative path (`<model>/config.pbtxt`, `<model>/1/model.py`) -> file content.

    `python_path` matters to the cpu-reference backend only: where its model.py finds its imports.
    """
    env = _environment()
    if spec.engine.backend == Backend.CPU_REFERENCE and speaks_llmapi(spec):
        return cpu_llmapi_files(spec, python_path)
    if spec.engine.backend == Backend.CPU_REFERENCE:
        # The engine contract: `tensorrt_llm` (token ids: the OpenAI front door's, the one decoder)
        # and `ensemble` (text, for clients of /v2, calling tensorrt_llm). The model files ship in
        # the repository itself, so a materialized ConfigMap is a complete, loadable repository.
        values = cpu_values(spec, python_path)
        return {
            path: text
            for model, source in CPU_ENGINE_MODELS.items()
            for path, text in (
                (f"{model}/config.pbtxt", env.get_template(f"cpu_reference/{model}.pbtxt.j2").render(values)),
                (f"{model}/1/model.py", source.read_text(encoding="utf-8")),
            )
        }  # fmt: skip
    if spec.engine.backend == Backend.PYTORCH:
        # NVIDIA's model.py (as base_model.py) and helpers.py ship in the serving image: the
        # launcher adds them.
        return {
            "tensorrt_llm/config.pbtxt": env.get_template("llmapi/tensorrt_llm.pbtxt.j2").render(
                _common(spec, PROFILES[spec.runtime.profile]), cpu=False
            ),
            "tensorrt_llm/1/model.yaml": env.get_template("llmapi/model.yaml.j2").render(
                llmapi_values(spec, pool, model_dir)
            ),
            **_files(LLMAPI_MODEL_FILES),
        }
    values = trtllm_values(spec, pool, engine_dir, tokenizer_dir)
    return {
        f"{model}/config.pbtxt": env.get_template(f"inflight_batcher_llm/{model}.pbtxt.j2").render(values)
        for model in TRTLLM_MODELS
    }


def to_configmap_data(files: Mapping[str, str]) -> dict[str, str]:
    return {configmap_key(path): text for path, text in sorted(files.items())}
