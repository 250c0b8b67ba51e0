"""The autoscaler of an LLMDeployment, on its scale subresource, driven by Triton metrics.

provider hpa: a HorizontalPodAutoscaler on per-pod custom metrics, served by prometheus-adapter
from recording rules over Triton's :8002/metrics (names below; the chart ships the matching rules,
charts/llm-operator/monitoring/). provider keda: a KEDA ScaledObject whose prometheus trigger
queries the same recorded series; KEDA then owns an HPA on an external metric.

Either scales the LLMDeployment (spec.replicas); the operator then splits replicas over pools and
revisions. With minReplicas 0 (keda only) the ScaledObject also wakes and idles the deployment:
render/scale_to_zero.py.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from lightkube.utils.quantity import parse_quantity

from llm_operator import labels as L
from llm_operator.api.v1alpha1 import (
    API_VERSION,
    KIND,
    AutoscalingMetric,
    AutoscalingProvider,
    AutoscalingSpec,
)
from llm_operator.render import names, scale_to_zero

DEFAULT_PROMETHEUS_URL = "http://prometheus.monitoring.svc:9090"
KEDA_API_VERSION = "keda.sh/v1alpha1"
# The recorded series carry the pod label llmoperator.io/deployment under this name (the chart's
# PodMonitor podTargetLabels; recording-rules.yaml keeps it).
DEPLOYMENT_SERIES_LABEL = "llmoperator_io_deployment"

METRIC_NAMES = {
    AutoscalingMetric.QUEUE_TO_COMPUTE_RATIO: "triton_queue_compute_ratio",
    AutoscalingMetric.PENDING_REQUESTS: "triton_pending_requests",
    AutoscalingMetric.QUEUE_TIME: "triton_queue_time_microseconds",
    AutoscalingMetric.KV_CACHE_UTILIZATION: "trtllm_kv_cache_utilization",
}


def autoscaler(
    deployment: str,
    namespace: str,
    autoscaling: AutoscalingSpec,
    prometheus_url: str = DEFAULT_PROMETHEUS_URL,
    *,
    capacity: int = 1,
    canary: bool = False,
) -> dict[str, Any]:
    """`capacity`: requests one replica takes at once (the wake trigger's target at minReplicas 0);
    `canary`: a canary rollout is under way, which needs replicas (minReplicas 0 is then 1)."""
    if autoscaling.provider == AutoscalingProvider.KEDA:
        return scaled_object(
            deployment, namespace, autoscaling, prometheus_url, capacity=capacity, canary=canary
        )
    return horizontal_pod_autoscaler(deployment, namespace, autoscaling)


def _scale_target(deployment: str) -> dict[str, str]:
    return {"apiVersion": API_VERSION, "kind": KIND, "name": deployment}


def horizontal_pod_autoscaler(
    deployment: str, namespace: str, autoscaling: AutoscalingSpec
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "scaleTargetRef": _scale_target(deployment),
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


def keda_query(deployment: str, namespace: str, metric: AutoscalingMetric) -> str:
    """The deployment's total of the per-pod metric: KEDA's AverageValue target divides it by the
    replica count, as the HPA's Pods metric averages over pods."""
    series = METRIC_NAMES[metric]
    return f'sum({series}{{namespace="{namespace}",{DEPLOYMENT_SERIES_LABEL}="{deployment}"}})'


def _plain_number(quantity: str) -> str:
    """KEDA's threshold is a number, not a Kubernetes quantity: 800m -> 0.8."""
    value = parse_quantity(quantity)
    assert value is not None  # admission checked isQuantity()
    return format(Decimal(value).normalize(), "f")


def scaled_object(
    deployment: str,
    namespace: str,
    autoscaling: AutoscalingSpec,
    prometheus_url: str,
    *,
    capacity: int = 1,
    canary: bool = False,
) -> dict[str, Any]:
    zero = autoscaling.zero
    query = keda_query(deployment, namespace, autoscaling.metric)
    if zero is not None:
        query = scale_to_zero.at_zero(query, deployment, namespace)
    spec: dict[str, Any] = {
        "scaleTargetRef": _scale_target(deployment),
        # A canary and its stable need a replica each (rollout/split.py keeps one of each from a
        # total of 1): never zero while one runs; KEDA raises a target below it to it.
        "minReplicaCount": 1 if zero is not None and canary else autoscaling.min_replicas,
        "maxReplicaCount": autoscaling.max_replicas,
        **(scale_to_zero.keda_timing(zero) if zero is not None else {}),
        "triggers": [
            {
                "type": "prometheus",
                "metricType": "AverageValue",
                "metadata": {
                    "serverAddress": prometheus_url,
                    "query": query,
                    "threshold": _plain_number(autoscaling.target),
                    # No series (Prometheus gone, no data yet) is an error, not 0: the HPA then
                    # keeps the current replica count instead of scaling down.
                    "ignoreNullValues": "false",
                },
            }
        ],
    }
    if zero is not None:
        spec["triggers"] += [scale_to_zero.wake_trigger(deployment, namespace, prometheus_url, capacity),
                             scale_to_zero.push_trigger(deployment, namespace, capacity)]  # fmt: skip
    if autoscaling.behavior:
        spec["advanced"] = {"horizontalPodAutoscalerConfig": {"behavior": autoscaling.behavior}}
    return {
        "apiVersion": KEDA_API_VERSION,
        "kind": "ScaledObject",
        "metadata": {
            "name": names.autoscaler(deployment),
            "namespace": namespace,
            "labels": L.common_labels(deployment, "autoscaler"),
        },
        "spec": spec,
    }
