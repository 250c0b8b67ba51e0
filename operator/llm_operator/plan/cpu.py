"""Plan for the cpu-reference backend: no GPUs, no engine, one pod per replica."""

from __future__ import annotations

from llm_operator.api.v1alpha1 import BUILTIN_URIS, CACHED_SCHEMES, LLMDeploymentSpec
from llm_operator.plan.types import Plan, PlanningError, PoolPlan

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
    pool = PoolPlan(
        name="main",
        gpu_product=CPU_PRODUCT,
        allowed_products=(),
        compute_capability=(0, 0),
        gpu_memory_mib=0,
        tensor=1,
        pipeline=1,
        gpus_per_pod=0,
        pods_per_replica=1,
        replicas=spec.replicas,
    )
    return Plan(pools=(pool,), reason="cpu-reference backend: one CPU pod per replica, no GPU")
