"""AutoscalingActive: the autoscaler's own report (HPA conditions, KEDA's ScaledObject) becomes a
condition of the LLMDeployment that names the metric and what is missing; reported, never acted
on. Messages below are the HPA controller's and KEDA's own words."""

from __future__ import annotations

from typing import Any

import pytest
from llm_operator.api.v1alpha1 import AutoscalingSpec
from llm_operator.controller.status import autoscaling
from llm_operator.controller.status.autoscaling import AutoscalerObserved, condition, observe
from llm_operator.controller.status.status import Observation, reduce

from tests.unit.test_status import PLAN

NS, NAME = "team", "tiny"


def spec(**fields: Any) -> AutoscalingSpec:
    return AutoscalingSpec.model_validate(
        {"maxReplicas": 3, "metric": "pending-requests", "target": "4", **fields}
    )


def hpa(*conditions: tuple[str, str, str, str], current: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {
        "conditions": [{"type": t, "status": s, "reason": r, "message": m} for t, s, r, m in conditions]
    }
    if current is not None:
        pods = {"metric": {"name": "triton_pending_requests"}, "current": {"averageValue": current}}
        status["currentMetrics"] = [{"type": "Pods", "pods": pods}]
    return {"kind": "HorizontalPodAutoscaler", "metadata": {"name": NAME, "namespace": NS}, "status": status}


ABLE = (
    "AbleToScale",
    "True",
    "SucceededGetScale",
    "the HPA controller was able to get the target's current scale",
)


def failed(message: str) -> tuple[str, str, str, str]:
    said = "the HPA was unable to compute the replica count: unable to get metric triton_pending_requests"
    return ("ScalingActive", "False", "FailedGetPodsMetric", f"{said}: {message}")


def observed(obj: dict[str, Any] | None, **kw: Any) -> AutoscalerObserved:
    s = spec(**kw)
    children = {} if obj is None else {(obj["kind"], NS, obj["metadata"]["name"]): obj}
    return observe(children, NS, NAME, s)


@pytest.mark.parametrize(
    ("message", "reason", "cause"),
    [
        ("no custom metrics API (custom.metrics.k8s.io) registered", "MetricsApiUnavailable", "no adapter"),
        ("unable to fetch metrics from custom metrics API: the server could not find the metric "
         "triton_pending_requests for pods", "MetricNotFound", "recording rules"),
        ("unable to fetch metrics from custom metrics API: no metrics returned from custom metrics API",
         "NoMetricData", "no data for this deployment's pods"),
        ("something new", "MetricUnavailable", "docs/autoscaling.md"),
    ],
)  # fmt: skip
def test_a_metric_the_hpa_cannot_read_names_the_metric_the_cause_and_the_hpas_words(
    message: str, reason: str, cause: str
) -> None:
    c = condition(observed(hpa(ABLE, failed(message))), 7)
    assert (c["type"], c["status"], c["reason"], c["observedGeneration"]) == (
        "AutoscalingActive",
        "False",
        reason,
        7,
    )
    assert "triton_pending_requests" in c["message"] and cause in c["message"] and message in c["message"]
    assert "Replicas stay as they are" in c["message"]


def test_a_working_hpa_reports_the_metric_and_target_but_not_the_changing_value() -> None:
    active = (
        "ScalingActive",
        "True",
        "ValidMetricFound",
        "the HPA was able to successfully calculate a replica count",
    )
    c = condition(observed(hpa(ABLE, active, current="2500m")), 1)
    assert (c["status"], c["reason"]) == ("True", "MetricAvailable")
    assert "triton_pending_requests (target 4 per pod)" in c["message"] and "2500m" not in c["message"]


def test_before_the_hpa_controller_reports_the_state_is_unknown() -> None:
    assert condition(observed(None), 1)["status"] == "Unknown"
    assert condition(observed(hpa()), 1)["reason"] == "AutoscalerPending"


def test_a_scale_target_the_hpa_cannot_reach_is_reported() -> None:
    c = condition(observed(hpa(("AbleToScale", "False", "FailedGetScale", "no matches for kind"))), 1)
    assert (c["status"], c["reason"]) == ("False", "CannotScale") and "no matches for kind" in c["message"]


def scaled_object(ready: tuple[str, str, str] | None) -> dict[str, Any]:
    conds = (
        []
        if ready is None
        else [{"type": "Ready", "status": ready[0], "reason": ready[1], "message": ready[2]}]
    )
    return {
        "kind": "ScaledObject",
        "metadata": {"name": NAME, "namespace": NS},
        "status": {"conditions": conds},
    }


def test_keda_missing_not_ready_pending_and_ready() -> None:
    missing = observe({}, NS, NAME, spec(provider="keda"), api_missing=True)
    c = condition(missing, 1)
    assert (c["status"], c["reason"]) == ("False", "KedaNotInstalled") and "provider: hpa" in c["message"]
    assert condition(observed(scaled_object(None), provider="keda"), 1)["reason"] == "AutoscalerPending"
    not_ready = scaled_object(
        ("False", "ScaledObjectCheckFailed", "failed to ensure HPA is correctly created")
    )
    c = condition(observed(not_ready, provider="keda"), 1)
    assert (c["status"], c["reason"]) == ("False", "ScaledObjectNotReady") and "failed to ensure" in c[
        "message"
    ]
    ready = observed(
        scaled_object(("True", "ScaledObjectReady", "ScaledObject is defined correctly")), provider="keda"
    )
    assert condition(ready, 1)["status"] == "True"


def test_kedas_hpa_failing_to_read_the_metric_is_reported_through_the_ready_scaled_object() -> None:
    ready = scaled_object(("True", "ScaledObjectReady", "ScaledObject is defined correctly"))
    said = "unable to get external metric team/s0-prometheus: no metrics returned"
    keda_hpa = hpa(ABLE, ("ScalingActive", "False", "FailedGetExternalMetric", said))
    keda_hpa["metadata"]["name"] = autoscaling.KEDA_HPA_PREFIX + NAME
    children = {
        ("ScaledObject", NS, NAME): ready,
        ("HorizontalPodAutoscaler", NS, keda_hpa["metadata"]["name"]): keda_hpa,
    }
    c = condition(observe(children, NS, NAME, spec(provider="keda")), 1)
    assert (c["status"], c["reason"]) == ("False", "NoMetricData")


def test_the_reducer_adds_the_condition_and_a_warning_event_on_failure_only() -> None:
    plan = PLAN
    broken = Observation(
        1, plan, autoscaler=observed(hpa(ABLE, failed("no custom metrics API (x) registered")))
    )
    status, events = reduce(broken, None, "t0")
    cond = next(c for c in status["conditions"] if c["type"] == "AutoscalingActive")
    assert cond["status"] == "False"
    assert [(e.type, e.reason) for e in events if e.reason == "MetricsApiUnavailable"] == [
        ("Warning", "MetricsApiUnavailable")
    ]
    # The phase and readiness are the serving pods' business: the same as without autoscaling.
    plain, _ = reduce(Observation(1, plan), None, "t0")
    assert (status["phase"], status["replicas"]) == (plain["phase"], plain["replicas"])
    assert not any(c["type"] == "AutoscalingActive" for c in plain["conditions"])
    _, events = reduce(broken, status, "t1")
    assert not events, "no repeated Event while nothing changes"
