"""HorizontalPodAutoscaler on the LLMDeployment's scale subresource, driven by Triton metrics.

The HPA scales the LLMDeployment (spec.replicas); the operator then splits replicas over pools
and revisions. Metrics are per-pod custom metrics served by prometheus-adapter from recording
rules over Triton's :8002/metrics (names below; the chart ships the matching rules).
"""

from __future__ import annotations

from typing import Any

from llm_operator import labels as L
from llm_operator.api.v1alpha1 import API_VERSION, KIND, AutoscalingMetric, AutoscalingSpec
from llm_operator.render import names

METRIC_NAMES = {
    AutoscalingMetric.QUEUE_TO_COMPUTE_RATIO: "triton_queue_compute_ratio",
    AutoscalingMetric.PENDING_REQUESTS: "triton_pending_requests",
    AutoscalingMetric.QUEUE_TIME: "triton_queue_time_microseconds",
    AutoscalingMetric.KV_CACHE_UTILIZATION: "trtllm_kv_cache_utilization",
}


def autoscaler(deployment: str, namespace: str, autoscaling: AutoscalingSpec) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": API_VERSION, "kind": KIND, "name": deployment},
        "minReplicas": autoscaling.min_replicas,
        "maxReplicas": autoscaling.max_replicas,
        "metrics": [
            {
                "type": "Pods",
                "pods": {
                    "metric": {"name": METRIC_NAMES[autoscaling.metric]},
                    "target": {"type": "AverageValue", "averageValue": autoscaling.target},
                },
            }
        ],
    }
    if autoscaling.behavior:
        spec["behavior"] = autoscaling.behavior
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {
            "name": names.autoscaler(deployment),
            "namespace": namespace,
            "labels": L.common_labels(deployment, "autoscaler"),
        },
        "spec": spec,
    }
