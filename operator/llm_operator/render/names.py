"""Deterministic child names, so a retried or repeated reconcile converges on the same objects."""

from __future__ import annotations

import hashlib

from llm_operator.plan.types import PoolPlan

MAX_NAME = 63  # DNS label: Service and StatefulSet names become pod host names


def _fit(name: str) -> str:
    """Shorten over-long names with a stable hash suffix instead of failing at apply time."""
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: MAX_NAME - 9].rstrip('-')}-{digest}"


def serving(deployment: str, pool: PoolPlan) -> str:
    """StatefulSet of single-pod replicas; a single-pool deployment keeps the plain name."""
    return _fit(deployment if pool.name == "main" else f"{deployment}-{pool.name}")


def group(deployment: str, pool: PoolPlan, index: int) -> str:
    """StatefulSet of one multi-node replica (its pods are ranks of one TensorRT-LLM world)."""
    return _fit(f"{serving(deployment, pool)}-g{index}")


def model_repo(deployment: str, pool: PoolPlan) -> str:
    return _fit(f"{serving(deployment, pool)}-model-repo")


def client_service(deployment: str) -> str:
    return _fit(deployment)


def headless_service(deployment: str) -> str:
    return _fit(f"{deployment}-pods")


def disruption_budget(deployment: str, pool: PoolPlan) -> str:
    return serving(deployment, pool)


def autoscaler(deployment: str) -> str:
    return _fit(deployment)


def engine_job(deployment: str, pool: PoolPlan, cache_key: str) -> str:
    return _fit(f"{serving(deployment, pool)}-engine-{cache_key[-10:]}")
