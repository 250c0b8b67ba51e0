"""Is the autoscaler of an LLMDeployment working? Its HPA's (or KEDA ScaledObject's) own status,
read from the watch cache, becomes the AutoscalingActive condition (pure: no I/O).

A metric without data must never change replicas: the HPA controller keeps the current count
when it cannot read the metric, and the operator only reports it here, naming the metric and what
is most likely missing (no adapter, no series, no data for this deployment's pods), next to the
HPA's own words. docs/autoscaling.md explains each case.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llm_operator.api.v1alpha1 import AutoscalingProvider, AutoscalingSpec
from llm_operator.render import names
from llm_operator.render.autoscaling import METRIC_NAMES

CONDITION = "AutoscalingActive"
KEDA_HPA_PREFIX = "keda-hpa-"  # KEDA names the HPA it creates for a ScaledObject keda-hpa-<name>
# The HPA controller's ScalingActive reason while its target has 0 replicas (kubernetes v1.34
# pkg/controller/podautoscaler/horizontal.go): at minReplicas 0 KEDA scaled it there on purpose.
SCALING_DISABLED = "ScalingDisabled"


@dataclass(frozen=True)
class AutoscalerObserved:
    provider: AutoscalingProvider
    metric: str  # the custom metric name the HPA asks for
    target: str
    autoscaler: dict[str, Any] | None  # our HPA or ScaledObject, as last seen
    keda_hpa: dict[str, Any] | None = None  # the HPA KEDA made for our ScaledObject
    api_missing: bool = False  # the ScaledObject API (KEDA's CRDs) is not installed


def observe(
    children: Mapping[tuple[str, str, str], dict[str, Any]],
    namespace: str,
    deployment: str,
    spec: AutoscalingSpec,
    *,
    api_missing: bool = False,
) -> AutoscalerObserved:
    name = names.autoscaler(deployment)
    keda = spec.provider == AutoscalingProvider.KEDA
    return AutoscalerObserved(
        provider=spec.provider,
        metric=METRIC_NAMES[spec.metric],
        target=spec.target,
        autoscaler=children.get(("ScaledObject" if keda else "HorizontalPodAutoscaler", namespace, name)),
        # KEDA copies the ScaledObject's labels onto its HPA, so our label-filtered watch sees it.
        keda_hpa=children.get(("HorizontalPodAutoscaler", namespace, KEDA_HPA_PREFIX + name))
        if keda
        else None,
        api_missing=api_missing,
    )


def _conditions(obj: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {c.get("type", ""): c for c in ((obj or {}).get("status") or {}).get("conditions") or []}


# What the HPA controller's message says -> (reason, what is most likely missing).
_CAUSES = (
    (("no custom metrics API", "could not find the requested resource", "unable to handle the request",
      "connection refused", "the server is currently unable"),
     "MetricsApiUnavailable",
     "no adapter serves custom.metrics.k8s.io (prometheus-adapter with the chart's adapter rules)"),
    (("could not find the metric",),
     "MetricNotFound",
     "the adapter has no series of this name: recording rules not loaded, or Prometheus unreachable "
     "or not scraping the serving pods"),
    (("no metrics returned", "did not receive metrics"),
     "NoMetricData",
     "no data for this deployment's pods yet: pods starting, or not scraped"),
)  # fmt: skip


def _unavailable(metric: str, hpa_reason: str, hpa_message: str) -> tuple[str, str]:
    reason, cause = next(
        ((r, c) for phrases, r, c in _CAUSES if any(p in hpa_message for p in phrases)),
        ("MetricUnavailable", "see docs/autoscaling.md"),
    )
    return reason, (
        f"metric {metric} is unavailable ({cause}); the HPA says {hpa_reason}: {hpa_message}. "
        "Replicas stay as they are."
    )


def _from_hpa(hpa: dict[str, Any], metric: str, target: str, what: str) -> tuple[str, str, str]:
    """(status, reason, message) from an HPA's conditions."""
    conds = _conditions(hpa)
    able, active = conds.get("AbleToScale"), conds.get("ScalingActive")
    if able is not None and able.get("status") == "False":
        return "False", "CannotScale", f"{what}: {able.get('reason')}: {able.get('message', '')}"
    if active is None:
        return "Unknown", "AutoscalerPending", f"the HPA controller has not reported on {what} yet"
    if active.get("status") != "True":
        reason, message = _unavailable(metric, active.get("reason", ""), active.get("message", ""))
        return "False", reason, message
    # No current value here: it changes every HPA sync and would rewrite status each time.
    return "True", "MetricAvailable", f"{what} reads {metric} (target {target} per pod)"


def condition(a: AutoscalerObserved, generation: int) -> dict[str, Any]:
    def cond(status: str, reason: str, message: str) -> dict[str, Any]:
        return {"type": CONDITION, "status": status, "reason": reason, "message": message,
                "observedGeneration": generation}  # fmt: skip

    if a.provider == AutoscalingProvider.HPA:
        if a.autoscaler is None:
            return cond("Unknown", "AutoscalerPending", "the HorizontalPodAutoscaler is being created")
        return cond(*_from_hpa(a.autoscaler, a.metric, a.target, "the HorizontalPodAutoscaler"))
    if a.api_missing:
        return cond("False", "KedaNotInstalled",
                    "autoscaling.provider is keda, but the cluster has no ScaledObject API "
                    "(keda.sh/v1alpha1): install KEDA, or set autoscaling.provider: hpa. "
                    "Replicas stay as they are.")  # fmt: skip
    ready = _conditions(a.autoscaler).get("Ready")
    if ready is None:
        return cond("Unknown", "AutoscalerPending", "KEDA has not reported on the ScaledObject yet")
    if ready.get("status") == "False":
        said = f"{ready.get('reason', '')}: {ready.get('message', '')}"
        return cond("False", "ScaledObjectNotReady", f"KEDA says {said}. Replicas stay as they are.")
    if a.keda_hpa is not None:
        active = _conditions(a.keda_hpa).get("ScalingActive") or {}
        if active.get("reason") == SCALING_DISABLED:
            return cond("True", "ScaledToZero",
                        "KEDA scaled the deployment to zero replicas (autoscaling.minReplicas 0); a request "
                        "through the router is held and wakes it")  # fmt: skip
        status, reason, message = _from_hpa(a.keda_hpa, a.metric, a.target, "KEDA's HPA")
        if status != "True":
            return cond(status, reason, message)
    return cond("True", "ScaledObjectReady", f"KEDA scales on {a.metric}, target {a.target} per pod")
