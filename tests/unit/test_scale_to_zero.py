"""Scale to zero (autoscaling.minReplicas 0; render/scale_to_zero.py): the ScaledObject the operator
renders for it, the Python twins of its admission rules, the status at zero, and KEDA's queries
evaluated by the real promtool on series as the test world's Prometheus scrapes them."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator.api.v1alpha1 import (
    HOLD_MESSAGE,
    IDLE_MESSAGE,
    ZERO_NEEDS_KEDA,
    ZERO_NEEDS_POOL,
    AutoscalingProvider,
    LLMDeployment,
    LLMDeploymentSpec,
)
from llm_operator.controller.status import autoscaling as status
from llm_operator.images import Images
from llm_operator.render import autoscaling, scale_to_zero
from llm_operator.render.router.limits import replica_capacity, router_limits
from llm_operator.render.router.objects import limits_for, router_config, router_deployment, router_service
from llm_operator.waker.activity import CAPACITY_KEY
from pydantic import ValidationError

from tests.unit.test_monitoring_rules import needs_promtool, promtool

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cpu-reference-scale-to-zero.yaml"
DOC: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
NAME, NS = "tiny-llama-zero", "team"
IMAGES = Images("runtime", "cpu-runtime", "", "1.1.0")


def spec(**autoscaling: Any) -> LLMDeploymentSpec:
    doc = copy.deepcopy(DOC["spec"])
    doc["autoscaling"].update(autoscaling)
    return LLMDeploymentSpec.model_validate(doc)


def scaled(s: LLMDeploymentSpec, canary: bool = False) -> dict[str, Any]:
    assert s.autoscaling is not None
    obj = autoscaling.autoscaler(NAME, NS, s.autoscaling, capacity=replica_capacity(s), canary=canary)
    return dict(obj["spec"])


def test_the_scaled_object_at_zero_wakes_on_held_requests_and_idles_after_the_window() -> None:
    s = spec()
    obj = scaled(s)
    assert (obj["minReplicaCount"], obj["maxReplicaCount"]) == (0, 2)
    assert (obj["pollingInterval"], obj["cooldownPeriod"], obj["initialCooldownPeriod"]) == (
        scale_to_zero.POLLING_SECONDS, 60, 60,
    )  # fmt: skip
    serving, wake, push = obj["triggers"]
    # The serving trigger is the user's metric, reading 0 when no serving pod is scraped.
    assert serving["metadata"]["query"].startswith(autoscaling.keda_query(NAME, NS, s.autoscaling.metric))  # type: ignore[union-attr]
    assert serving["metadata"]["threshold"] == "4" and serving["metadata"]["ignoreNullValues"] == "false"
    assert wake["name"] == scale_to_zero.WAKE_TRIGGER
    # A replica per batch and its queue's worth of requests (8 + 8): what the router sizes by too.
    assert wake["metadata"]["threshold"] == "16" and wake["metadata"]["activationThreshold"] == "0"
    assert wake["metadata"]["query"] == scale_to_zero.wake_query(NAME, NS)
    # The direct wake-up: KEDA's external-push scaler on the router's waker, the same capacity.
    assert push == {
        "type": "external-push", "name": "push", "metricType": "AverageValue",
        "metadata": {"scalerAddress": f"{NAME}-router.{NS}.svc:9091", CAPACITY_KEY: "16"},
    }  # fmt: skip
    # A canary and its stable need a replica each: never zero while one runs.
    assert scaled(s, canary=True)["minReplicaCount"] == 1


def test_above_zero_nothing_changes() -> None:
    s = spec(minReplicas=1, scaleToZero=None)
    obj = scaled(s, canary=True)
    assert obj["minReplicaCount"] == 1 and len(obj["triggers"]) == 1
    assert not {"pollingInterval", "cooldownPeriod", "initialCooldownPeriod"} & set(obj)
    assert obj["triggers"][0]["metadata"]["query"] == autoscaling.keda_query(NAME, NS, s.autoscaling.metric)  # type: ignore[union-attr]
    assert router_limits(s).hold_s == 0


def test_the_waker_serves_keda_on_the_router_services_push_port() -> None:
    def ports(s: LLMDeploymentSpec) -> tuple[list[Any], list[Any]]:
        ld = LLMDeployment.model_validate({"metadata": {"name": NAME, "namespace": NS}, "spec": s})
        limits = limits_for(ld)
        pod = router_deployment(ld, IMAGES, router_config(ld, limits), limits)["spec"]["template"]["spec"]
        waker = [c for c in pod["containers"] if c["name"] == "waker"]
        return router_service(ld)["spec"]["ports"], waker

    service, (waker,) = ports(spec())
    assert {"name": "keda-push", "port": 9091, "targetPort": "keda-push", "protocol": "TCP",
            "appProtocol": "kubernetes.io/h2c"} in service  # fmt: skip
    assert {"name": "keda-push", "containerPort": 9091, "protocol": "TCP"} in waker["ports"]
    assert waker["args"][waker["args"].index("--push-port") + 1] == "9091"
    service, no_waker = ports(spec(minReplicas=1, scaleToZero=None))
    assert [p["name"] for p in service] == ["openai", "grpc-picker"] and not no_waker


def test_the_router_makes_room_for_the_held_requests() -> None:
    at_zero, above = router_limits(spec()), router_limits(spec(minReplicas=1, scaleToZero=None))
    assert at_zero.requests == above.requests + 100  # maxHeldRequests of the example
    assert at_zero.connections == 2 * at_zero.requests


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"provider": "hpa"}, ZERO_NEEDS_KEDA),
        ({"scaleToZero": {"holdSeconds": 0}}, HOLD_MESSAGE),
        ({"scaleToZero": {"idleSeconds": 29}}, IDLE_MESSAGE),
        ({"minReplicas": 1}, "autoscaling.scaleToZero applies only with autoscaling.minReplicas 0"),
    ],
)
def test_bad_input_is_refused_with_what_to_change(change: dict[str, Any], message: str) -> None:
    """The CEL rules' twins (tests/e2e/test_admission.py holds the API server to the same words)."""
    with pytest.raises(ValidationError, match=message.split(":")[0]):
        spec(**change)


def test_zero_without_the_pool_is_refused() -> None:
    doc = copy.deepcopy(DOC["spec"])
    del doc["routing"]
    with pytest.raises(ValidationError, match=ZERO_NEEDS_POOL.split(":")[0]):
        LLMDeploymentSpec.model_validate(doc)


def test_the_condition_says_scaled_to_zero_while_keda_holds_the_deployment_there() -> None:
    ld = LLMDeployment.model_validate({"metadata": {"name": NAME, "namespace": NS}, "spec": DOC["spec"]})
    assert ld.spec.autoscaling is not None and ld.spec.autoscaling.provider == AutoscalingProvider.KEDA
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    # What the HPA controller says of a target at 0 replicas (KEDA's HPA at minReplicas 1).
    disabled = "scaling is disabled since the replica count of the target is zero"
    hpa = {"status": {"conditions": [
        {"type": "ScalingActive", "status": "False", "reason": "ScalingDisabled", "message": disabled}
    ]}}  # fmt: skip
    seen = status.AutoscalerObserved(AutoscalingProvider.KEDA, "triton_pending_requests", "4", ready, hpa)
    cond = status.condition(seen, 1)
    assert (cond["status"], cond["reason"]) == ("True", "ScaledToZero"), cond


# --- KEDA's queries, evaluated by promtool ----------------------------------------------------------


def _series(metric: str, value: str, **labels: str) -> dict[str, str]:
    return {"series": metric + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "values": value}


SERVING = {"namespace": NS, "llmoperator_io_deployment": NAME}
ROUTER = {"namespace": NS, "pod": "tiny-llama-zero-router-x", "app_kubernetes_io_instance": NAME}


def _pod(n: int, up: int, **metrics: int) -> list[dict[str, str]]:
    """A serving pod's `up` and gauges, as the test world's scrape labels them."""
    labels = {**SERVING, "pod": f"{NAME}-{n}"}
    found = [_series("up", f"{up}x20", **labels)]
    if "pending" in metrics:
        found.append(
            _series(
                "nv_inference_pending_request_count", f"{metrics['pending']}x20", model="ensemble", **labels
            )
        )
    for kind in ("scheduled", "waiting", "active"):
        if kind in metrics:
            found.append(_series("nv_trt_llm_request_metrics", f"{metrics[kind]}x20", model="tensorrt_llm",
                                 request_type=kind, **labels))  # fmt: skip
    if "recorded" in metrics:
        found.append(_series("triton_pending_requests", f"{metrics['recorded']}x20", **labels))
    return found


def _picker(held: int | None, scraped: bool = True) -> list[dict[str, str]]:
    """The router's picker: its pool's ready pods (0 here, it makes no difference), and once a
    request was held, its queue."""
    found = [_series(scale_to_zero.PICKER_READY_PODS, "0x20", name=NAME, **ROUTER)] if scraped else []
    if held is not None:
        flow = {"fairness_id": "default-flow", "priority": "0", "model_name": "tiny-llama"}
        found.append(_series(scale_to_zero.PICKER_QUEUE, f"{held}x20", inference_pool=NAME, **flow, **ROUTER))
    return found


# (case, input series, serving trigger's value, wake trigger's value); None: no result, which KEDA
# (ignoreNullValues false) reports as the trigger failing.
CASES = [
    ("at zero, idle, before any request", _picker(None), 0, 0),
    ("at zero, three requests held", _picker(3), 0, 3),
    ("the first pod loading, two held", _picker(2) + _pod(0, up=0), 0, 2),
    ("serving: in flight, none held",
     _picker(0) + _pod(0, up=1, pending=1, scheduled=2, waiting=3, active=5, recorded=4), 4, 6),
    ("two pods, one idle", _picker(0) + _pod(0, up=1, pending=0, scheduled=1, waiting=0, recorded=0)
     + _pod(1, up=1, pending=0, scheduled=0, waiting=0, recorded=0), 0, 1),
    ("pods scraped, their series missing", _picker(0) + _pod(0, up=1), None, None),
    ("the router not scraped", _picker(None, scraped=False), 0, None),
]  # fmt: skip


@needs_promtool
def test_the_triggers_read_zero_at_zero_and_fail_only_on_missing_data(tmp_path: Path) -> None:
    s = spec()
    assert s.autoscaling is not None
    queries = {q: scaled(s)["triggers"][i]["metadata"]["query"] for i, q in enumerate(("serving", "wake"))}
    tests = []
    for case, inputs, serving, wake in CASES:
        expected = {"serving": serving, "wake": wake}
        tests.append({
            "name": case,
            "interval": "15s",
            "input_series": inputs,
            "promql_expr_test": [
                {"expr": queries[q], "eval_time": "2m",
                 "exp_samples": [] if v is None else [{"labels": "{}", "value": v}]}
                for q, v in expected.items()
            ],
        })  # fmt: skip
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({"tests": tests}))
    result = promtool("test", "rules", str(tmp_path / "tests.yaml"))
    assert result.returncode == 0, result.stdout + result.stderr
