"""Plan for the cpu-reference backend: no GPUs, no engine, one pod per replica."""

from __future__ import annotations

from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.plan.types import Plan, PoolPlan

CPU_PRODUCT = "cpu"


def cpu_plan(spec: LLMDeploymentSpec) -> Plan:
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
