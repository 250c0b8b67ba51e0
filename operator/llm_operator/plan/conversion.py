"""What an engine build must know before its Job runs (pure): the model family, which picks
TensorRT-LLM's checkpoint converter, the calibration dataset of quantized builds, and whether the
model is too large to quantize on the build's own GPUs (upstream's large-model fp8 route).

engine/build.py (standard library only, it runs in NVIDIA's image) holds the converters' paths
and flags per family; tests hold the two tables together.
"""

from __future__ import annotations

from llm_operator.api.v1alpha1 import (
    CALIBRATION_HINT,
    QUANTIZED_KV_CACHES,
    QUANTIZED_PRECISIONS,
    Backend,
    LLMDeploymentSpec,
    ModelFamily,
    ModelSpec,
    Precision,
)
from llm_operator.plan import catalogue
from llm_operator.plan.types import PlanningError, PoolPlan

KNOWN = ", ".join(f.value for f in ModelFamily)
# The model's own name (catalogue-normalized: no organisation, lower case) -> family, by prefix.
NAME_PREFIXES: tuple[tuple[str, ModelFamily], ...] = (
    ("llama", ModelFamily.LLAMA),
    ("tinyllama", ModelFamily.LLAMA),
    ("tiny-llama", ModelFamily.LLAMA),
    ("smollm", ModelFamily.LLAMA),
    ("codellama", ModelFamily.LLAMA),
    ("mistral", ModelFamily.MISTRAL),
    ("mixtral", ModelFamily.MIXTRAL),
    ("qwen", ModelFamily.QWEN),
    ("gemma", ModelFamily.GEMMA),
    ("falcon", ModelFamily.FALCON),
)
# Gemma's converter takes --world-size, tensor parallelism only (NVIDIA/TensorRT-LLM v1.1.0
# examples/models/core/gemma/convert_checkpoint.py builds Mapping(tp_size=world_size, pp_size=1)).
TENSOR_PARALLEL_ONLY = (ModelFamily.GEMMA,)
# Families converted by examples/models/core/llama/convert_checkpoint.py, which has
# --use_fp8_rowwise and --load_by_shard.
FP8_ROWWISE = (ModelFamily.LLAMA, ModelFamily.MISTRAL, ModelFamily.MIXTRAL)
# ModelOpt's quantize.py loads the whole 16-bit checkpoint onto the build's GPUs and runs
# calibration batches through it: past this share of their memory it is the large-model route.
QUANTIZE_MEMORY_PERCENT = 80


def builds_engine(spec: LLMDeploymentSpec) -> bool:
    return spec.engine.backend == Backend.TENSORRT_ENGINE and spec.engine.prebuilt is None


def family(model: ModelSpec) -> ModelFamily | None:
    """spec.model.family, else told from the model's name or its source URI's last segment."""
    if model.family is not None:
        return model.family
    for name in (model.name, model.source.uri.split("://", 1)[-1]):
        key = catalogue.normalize(name)
        for prefix, found in NAME_PREFIXES:
            if key.startswith(prefix):
                return found
    return None


def needs_calibration(spec: LLMDeploymentSpec) -> bool:
    e = spec.engine
    return e.precision.value in QUANTIZED_PRECISIONS or e.kv_cache_dtype.value in QUANTIZED_KV_CACHES


def check(spec: LLMDeploymentSpec) -> None:
    """Refuse a build that would fail in its Job: no converter for the model, pipeline
    parallelism the family's converter cannot shard."""
    if not builds_engine(spec):
        return
    found = family(spec.model)
    if found is None:
        raise PlanningError(
            "UnknownModelFamily",
            f"the engine build picks TensorRT-LLM's checkpoint converter by model family and "
            f"{spec.model.name} names none it knows: set spec.model.family to one of {KNOWN}",
        )
    pipeline = spec.parallelism.pipeline
    if found in TENSOR_PARALLEL_ONLY and pipeline != "auto" and pipeline != 1:
        raise PlanningError(
            "InvalidParallelism",
            f"TensorRT-LLM's {found.value} converter shards tensor-parallel only: set "
            f"parallelism.pipeline to 1 (or auto)",
        )


def pipeline_choices(spec: LLMDeploymentSpec) -> tuple[int, ...] | None:
    """The pipeline degrees the family's converter can build; None: any."""
    if builds_engine(spec) and family(spec.model) in TENSOR_PARALLEL_ONLY:
        return (1,)
    return None


def fp8_rowwise(spec: LLMDeploymentSpec, pool: PoolPlan) -> bool:
    """Upstream's route for fp8 models too large to quantize on their own GPUs (NVIDIA/TensorRT-LLM
    v1.1.0 examples/models/core/llama/README.md, "Run LLaMA-3.1 405B Model": convert_checkpoint.py
    --use_fp8_rowwise --load_by_shard, per-channel per-token fp8 on the MLP layers, "only supports
    SM90"): on Hopper, when the 16-bit weights exceed QUANTIZE_MEMORY_PERCENT of the build Job's
    GPUs (one per rank, up to one pod's), e.g. 405B (812 GB) on 8 x 80 GB."""
    if spec.engine.precision != Precision.FP8 or family(spec.model) not in FP8_ROWWISE:
        return False
    if pool.compute_capability != (9, 0):
        return False
    arch = catalogue.lookup(spec.model)
    if arch is None:
        return False
    gpus = min(pool.world_size, pool.gpus_per_pod)
    budget = gpus * pool.gpu_memory_mib * 2**20 * QUANTIZE_MEMORY_PERCENT // 100
    return arch.parameter_count * 2 > budget


def check_pool(spec: LLMDeploymentSpec, pool: PoolPlan) -> None:
    """A quantized build calibrates on a dataset, except on the large-model route, which converts
    without calibration and leaves the KV cache unquantized (upstream documents no KV option
    for it)."""
    if not builds_engine(spec) or not needs_calibration(spec):
        return
    rowwise = fp8_rowwise(spec, pool)
    build = spec.engine.build
    if not rowwise and (build is None or build.calibration is None):
        # Builds before engine.build.calibration let quantize.py fetch its default, cnn_dailymail,
        # from the Hub; the message says so, since the same manifest built then.
        raise PlanningError("CalibrationDatasetMissing", "a quantized engine build calibrates on the dataset "
                            "the spec names (builds no longer download cnn_dailymail from the Hub unasked): "
                            f"{CALIBRATION_HINT}")  # fmt: skip
    if rowwise and spec.engine.kv_cache_dtype.value in QUANTIZED_KV_CACHES:
        gpus = min(pool.world_size, pool.gpus_per_pod)
        raise PlanningError(
            "KvCacheDtypeUnsupported",
            f"{spec.model.name} in fp8 is too large to calibrate on {gpus} {pool.gpu_product}, so it is "
            f"converted shard by shard (fp8 rowwise), which leaves the KV cache unquantized: set "
            f"engine.kvCacheDtype to auto",
        )
