"""Operator settings from the environment (the Helm chart sets them), read once at start."""

from __future__ import annotations

import os
from dataclasses import dataclass

from llm_operator.images import Images
from llm_operator.render.autoscaling import DEFAULT_PROMETHEUS_URL

DEFAULT_TRTLLM_VERSION = "0.20.0"


@dataclass(frozen=True)
class OperatorConfig:
    images: Images
    workers: int
    metrics_port: int
    health_port: int
    namespaces: tuple[str, ...]  # empty: all namespaces
    prometheus_url: str = DEFAULT_PROMETHEUS_URL  # what KEDA ScaledObjects' triggers query

    @classmethod
    def from_env(cls, namespaces: tuple[str, ...] = ()) -> OperatorConfig:
        env = os.environ.get
        return cls(
            images=Images(
                runtime=env("LLMOP_RUNTIME_IMAGE", "ghcr.io/llm-operator/triton-trtllm-runtime:0.1.0"),
                cpu_runtime=env("LLMOP_CPU_RUNTIME_IMAGE", "ghcr.io/llm-operator/cpu-runtime:0.1.0"),
                engine_builder=env("LLMOP_ENGINE_BUILDER_IMAGE", "ghcr.io/llm-operator/engine-builder:0.1.0"),
                trtllm_version=env("LLMOP_TRTLLM_VERSION", DEFAULT_TRTLLM_VERSION),
            ),
            workers=int(env("LLMOP_WORKERS", "4")),
            metrics_port=int(env("LLMOP_METRICS_PORT", "8000")),
            health_port=int(env("LLMOP_HEALTH_PORT", "8080")),
            namespaces=namespaces,
            prometheus_url=env("LLMOP_PROMETHEUS_URL", DEFAULT_PROMETHEUS_URL),
        )
