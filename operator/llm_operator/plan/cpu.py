"""Plan for the cpu-reference backend: no GPUs, no engine; one pod per replica, or per pipeline
stage where the model is split over pods (runtime/cpu_reference/pipeline.py, engine.cpuReference.
contract pytorch: admission refuses stages on the ensemble's contract)."""

from __future__ import annotations

from llm_operator.api.v1alpha1 import BUILTIN_URIS, CACHED_SCHEMES, LLMDeploymentSpec
from llm_operator.plan.types import Plan, PlanningError, PoolPlan
from llm_operator.runtime.cpu_reference import BUILTIN_MODELS, TinyConfig

CPU_PRODUCT = "cpu"


def cpu_plan(spec: LLMDeploymentSpec) -> Plan:
    uri = spec.model.source.uri
    checkpoint = uri.startswith((*CACHED_SCHEMES, "pvc://"))  # in the runtime's checkpoint format
    if uri not in BUILTIN_URIS and not checkpoint:  # admission refuses it; objects stored before not
        raise PlanningError(
            "UnknownBuiltinModel",
            f"the cpu-reference backend serves its builtin models ({', '.join(BUILTIN_URIS)}) or a "
            f"checkpoint from s3://, hf:// or pvc://, not {uri}",
        )
    stages = spec.parallelism.pipeline if isinstance(spec.parallelism.pipeline, int) else 1
    builtin = BUILTIN_MODELS.get(uri.removeprefix("builtin://"))
    layers = builtin.layers if isinstance(builtin, TinyConfig) else None
    if layers is not None and stages > layers:
        raise PlanningError(
            "PipelineLongerThanModel",
            f"{uri} has {layers} layers: parallelism.pipeline must be at most {layers} (a stage is at "
            "least one layer)",
        )
    pool = PoolPlan(
        name="main",
        gpu_product=CPU_PRODUCT,
        allowed_products=(),
        compute_capability=(0, 0),
        gpu_memory_mib=0,
        tensor=1,
        pipeline=stages,
        gpus_per_pod=0,
        pods_per_replica=stages,
        replicas=spec.replicas,
    )
    if stages > 1:
        return Plan(
            pools=(pool,), reason=f"cpu-reference backend: {stages} pipeline stages, one CPU pod each"
        )
    return Plan(pools=(pool,), reason="cpu-reference backend: one CPU pod per replica, no GPU")
