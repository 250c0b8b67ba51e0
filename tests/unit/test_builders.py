"""Builders of the non-pod children: Services, PDB, HPA, names."""

from __future__ import annotations

from llm_operator.api.v1alpha1 import AutoscalingSpec
from llm_operator.plan.types import PoolPlan
from llm_operator.render import autoscaling, names, policy, services

POOL = PoolPlan(
    name="h100", gpu_product="NVIDIA-H100-80GB-HBM3", allowed_products=("NVIDIA-H100-80GB-HBM3",),
    compute_capability=(9, 0), gpu_memory_mib=81559, tensor=8, pipeline=2, gpus_per_pod=8,
    pods_per_replica=2, replicas=3,
)  # fmt: skip


def test_client_service_selects_only_leaders() -> None:
    svc = services.client_service("llama", "ns")
    assert svc["spec"]["selector"] == {"llmoperator.io/deployment": "llama", "llmoperator.io/role": "leader"}
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {
        "http": 8000,
        "grpc": 8001,
        "metrics": 8002,
        "openai": 8080,
    }


def test_headless_service_publishes_unready_pods_for_rank_discovery() -> None:
    svc = services.headless_service("llama", "ns")
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {"llmoperator.io/deployment": "llama"}


def test_disruption_budget_per_pool() -> None:
    pdb = policy.disruption_budget("llama", "ns", POOL)
    assert pdb["metadata"]["name"] == "llama-h100"
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"]["llmoperator.io/pool"] == "h100"


def test_autoscaler_targets_the_llmdeployment_scale_subresource() -> None:
    spec = AutoscalingSpec.model_validate(
        {"minReplicas": 2, "maxReplicas": 9, "metric": "queue-time", "target": "500m",
         "behavior": {"scaleDown": {"stabilizationWindowSeconds": 600}}}
    )  # fmt: skip
    hpa = autoscaling.autoscaler("llama", "ns", spec)["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "llmoperator.io/v1alpha1",
        "kind": "LLMDeployment",
        "name": "llama",
    }
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 9)
    metric = hpa["metrics"][0]["pods"]
    assert metric["metric"]["name"] == "triton_queue_time_microseconds"
    assert metric["target"] == {"type": "AverageValue", "averageValue": "500m"}
    assert hpa["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 600}}


def test_names_are_dns_labels_and_stable() -> None:
    long = "a" * 80
    assert len(names.serving(long, POOL)) <= 63
    assert names.serving(long, POOL) == names.serving(long, POOL)
    assert names.serving("llama", "main") == "llama"
    assert names.group("llama", POOL, 2) == "llama-h100-g2"
    assert names.engine_job("llama", POOL, "x" * 30 + "0123456789") == "llama-h100-engine-0123456789"
