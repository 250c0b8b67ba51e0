"""The Triton model repository: rendered from model_repo_templates/ with Jinja2, carried to the
pods in a ConfigMap, materialized by the launcher into the directory tritonserver loads.

ConfigMap keys allow only [-._a-zA-Z0-9], so `<model>/config.pbtxt` travels as
`<model>__config.pbtxt` (model names never contain `__`); version directories are recreated.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2

from llm_operator.api.v1alpha1 import Backend, LLMDeploymentSpec
from llm_operator.modelrepo.profiles import GPT_MODEL_TYPE, PROFILES, SCHEDULER_POLICY
from llm_operator.plan.types import PoolPlan

SEPARATOR = "__"
TRTLLM_MODELS = ("preprocessing", "tensorrt_llm", "postprocessing", "ensemble")


def templates_dir() -> Path:
    env = os.environ.get("LLMOP_MODEL_REPO_TEMPLATES")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "model_repo_templates"


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,  # a missing value fails rendering, never renders empty
        keep_trailing_newline=True,
        autoescape=False,
    )


def parameters(
    spec: LLMDeploymentSpec, pool: PoolPlan, engine_dir: str, tokenizer_dir: str
) -> dict[str, Any]:
    """Every value the templates use: the spec's, else the profile's documented default."""
    runtime = spec.runtime
    profile = PROFILES[runtime.profile]
    batching, kv = runtime.batching, runtime.kv_cache
    percent = kv.free_gpu_memory_percent or profile.kv_cache_free_gpu_memory_percent
    source = spec.model.source.uri
    return {
        "max_batch_size": spec.engine.max_batch_size,
        "decoupled": runtime.streaming,
        "max_queue_delay_microseconds": (
            batching.max_queue_delay_microseconds
            if batching.max_queue_delay_microseconds is not None
            else profile.max_queue_delay_microseconds
        ),
        "max_queue_size": batching.max_queue_size
        if batching.max_queue_size is not None
        else profile.max_queue_size,
        "batching_strategy": GPT_MODEL_TYPE[batching.strategy or profile.strategy],
        "scheduler_policy": SCHEDULER_POLICY[batching.scheduler_policy or profile.scheduler_policy],
        "engine_dir": engine_dir,
        "tokenizer_dir": runtime.tokenizer_uri or tokenizer_dir,
        "max_beam_width": spec.engine.max_beam_width,
        "kv_cache_free_gpu_mem_fraction": f"{percent / 100:.2f}",
        "max_tokens_in_paged_kv_cache": kv.max_tokens,
        "kv_cache_host_memory_bytes": kv.host_memory_bytes or 0,
        "enable_kv_cache_reuse": kv.block_reuse if kv.block_reuse is not None else profile.block_reuse,
        "enable_chunked_context": (
            runtime.chunked_context if runtime.chunked_context is not None else profile.chunked_context
        ),
        "exclude_input_in_output": runtime.exclude_input_in_output,
        "cancellation_check_period_ms": 100,
        "stats_check_period_ms": 100,
        "gpu_device_ids": ",".join(str(i) for i in range(pool.gpus_per_pod)),
        "tokenizer_instances": profile.tokenizer_instances,
        "model_name": source.split("://", 1)[1].strip("/"),
        "seed": int(hashlib.sha256(spec.model.revision.encode()).hexdigest()[:8], 16),
        "max_seq_len": spec.engine.max_seq_len,
    }


def render_repository(
    spec: LLMDeploymentSpec, pool: PoolPlan, *, engine_dir: str, tokenizer_dir: str
) -> dict[str, str]:
    """Relative path (`<model>/config.pbtxt`) -> file content."""
    env = _environment()
    values = parameters(spec, pool, engine_dir, tokenizer_dir)
    if spec.engine.backend == Backend.CPU_REFERENCE:
        models = {"ensemble": "cpu_reference/ensemble.pbtxt.j2"}
    else:
        models = {m: f"inflight_batcher_llm/{m}.pbtxt.j2" for m in TRTLLM_MODELS}
    return {f"{model}/config.pbtxt": env.get_template(t).render(**values) for model, t in models.items()}


def to_configmap_data(files: Mapping[str, str]) -> dict[str, str]:
    return {path.replace("/", SEPARATOR): text for path, text in sorted(files.items())}


def write_repository(files: Mapping[str, str], dest: str | Path) -> None:
    """Write rendered files as a Triton repository (one version directory `1/` per model)."""
    root = Path(dest)
    for path, text in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        (target.parent / "1").mkdir(exist_ok=True)


def materialize(
    configmap_dir: str | Path, dest_dir: str | Path, python_models: Mapping[str, Path] | None = None
) -> None:
    """Inside the pod: ConfigMap mount -> repository, plus each python model's model.py
    (`python_models`: model name -> model.py shipped in the image)."""
    files = {
        entry.name.replace(SEPARATOR, "/"): entry.read_text()
        for entry in Path(configmap_dir).iterdir()
        if SEPARATOR in entry.name and entry.is_file()
    }
    write_repository(files, dest_dir)
    for model, source in (python_models or {}).items():
        if (Path(dest_dir) / model).is_dir():
            shutil.copy(source, Path(dest_dir) / model / "1" / "model.py")
