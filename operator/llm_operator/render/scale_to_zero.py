"""Scale to zero (autoscaling.minReplicas 0, provider keda, routing.mode inference-pool): what KEDA
wakes and idles the deployment on, and how the router's endpoint picker holds requests meanwhile.
docs/autoscaling.md, "Scale to zero".

The chain: a request at zero replicas is held by the picker's flow control (GIE v1.5.0: the
`flowControl` feature gate; pkg/epp/framework/plugins/flowcontrol/saturationdetector/utilization
detector.go counts a pool without endpoints as saturated, so the request waits in the queue), whose
gauge `inference_extension_flow_control_queue_size{inference_pool}` (pkg/epp/metrics/metrics.go)
Prometheus scrapes from the router pod; KEDA's `wake` trigger reads it with the requests in flight on
the serving pods, and is active while their sum is above 0 (KEDA v2.21.0 pkg/scalers/prometheus_scaler.go:
value > activationThreshold). KEDA then sets spec.replicas to 1 (pkg/scaling/executor/
scale_scaledobjects.go, scaleFromZeroOrIdle), the operator creates the replica, and once its leader
is Ready the picker dispatches the held requests in arrival order (one priority band, fcfs ordering,
global-strict fairness: GIE's defaults). With no trigger active and none failing for cooldownPeriod,
KEDA sets spec.replicas to 0 (scaleToZeroOrIdle).

That chain waits for a scrape and a poll. The router's waker sees each request before the picker
holds it and pushes the activity to KEDA at once over KEDA's external-push protocol
(llm_operator/waker/push.py): the `push` trigger, the direct wake-up; `wake` stays as its fallback.

The hold of a deployment that sets none follows its measured cold start (derived_hold); as a
change of it restarts the router, a derived hold the router runs changes only at zero replicas, and
only upwards (hold_seconds).

Pure: the same spec, last cold start and running hold render the same objects.
"""

from __future__ import annotations

import math
from typing import Any

from llm_operator import labels as L
from llm_operator.api.v1alpha1 import (
    DEFAULT_HOLD_SECONDS,
    HOLD_COLD_START_FACTOR,
    HOLD_STEP_SECONDS,
    MAX_HOLD_SECONDS,
    LLMDeployment,
    ScaleToZeroSpec,
)
from llm_operator.render import names
from llm_operator.waker.activity import CAPACITY_KEY

# The picker's gauges (GIE v1.5.0 pkg/epp/metrics/metrics.go): the requests its flow control holds,
# per flow and priority, which exists from the first held request on; and the pool's ready pods
# (label `name`, the pool), which it records every few seconds from the moment it has synced its
# pool (pkg/epp/datalayer/logger/logger.go), zero pods included.
PICKER_QUEUE = "inference_extension_flow_control_queue_size"
PICKER_READY_PODS = "inference_pool_ready_pods"
# The EPP's config gate (pkg/epp/flowcontrol/config.go FeatureGate).
FLOW_CONTROL_GATE = "flowControl"
# How often KEDA asks whether the deployment is active (its default is 30 s): a request at zero
# waits up to this long, after the scrape that shows it, before the first replica is asked for. One
# Prometheus query per trigger per poll.
POLLING_SECONDS = 2
# What a refused client is told to wait before retrying: a retry is held again, so this only spaces
# retries out (render/router/hold.py).
RETRY_AFTER_SECONDS = 5
WAKE_TRIGGER = "wake"
PUSH_TRIGGER = "push"
# KEDA's external-push scaler on the router's waker (llm_operator/waker/push.py): gRPC, on the router
# Service, which the router's NetworkPolicy opens to KEDA's operator only (render/network.py).
PUSH_PORT = 9091
PUSH_PORT_NAME = "keda-push"


def _serving(deployment: str, namespace: str) -> str:
    """The serving pods' series: the scrape's labels (the chart's PodMonitor, e2e/cluster/monitoring.py)."""
    return f'namespace="{namespace}",llmoperator_io_deployment="{deployment}"'


def no_serving_target(deployment: str, namespace: str) -> str:
    """0 while no serving pod of the deployment is scraped successfully (at zero, or the first pod
    still loading), nothing otherwise: a query `or`-ed with it reads 0 at zero, and stays empty, an
    error for KEDA (ignoreNullValues false), when pods are scraped but their series are missing."""
    return f"(absent(up{{{_serving(deployment, namespace)}}} == 1) - 1)"


def at_zero(query: str, deployment: str, namespace: str) -> str:
    """A serving-pod query that reads 0 when there is no serving pod to measure: without it KEDA
    would report the trigger failing (Ready False) for as long as the deployment is at zero."""
    return f"{query} or on() {no_serving_target(deployment, namespace)}"


def held_query(deployment: str, namespace: str) -> str:
    """Requests the picker holds. The queue gauge appears with the first held request, so until
    then 0, provided the picker is scraped (its ready-pods gauge is there): a router Prometheus does
    not scrape stays an error, not a silent 0."""
    queue = f'{PICKER_QUEUE}{{namespace="{namespace}",inference_pool="{deployment}"}}'
    pool = f'{PICKER_READY_PODS}{{namespace="{namespace}",name="{deployment}"}}'
    return f"sum({queue}) or on() (0 * max({pool}))"


def in_flight_query(deployment: str, namespace: str) -> str:
    """Requests queued in Triton or inside the engine: Triton's pending count (queued before a
    model), TensorRT-LLM's scheduled (computing) and waiting (admitted, not scheduled: on the llmapi
    model also the LLM API's queue; runtime/trtllm_metrics.py) requests; the cpu-reference runtime
    exports the same gauges."""
    selector = _serving(deployment, namespace)
    engine = f'nv_trt_llm_request_metrics{{{selector},request_type=~"scheduled|waiting"}}'
    query = f"sum(nv_inference_pending_request_count{{{selector}}} or {engine})"
    return at_zero(query, deployment, namespace)


def wake_query(deployment: str, namespace: str) -> str:
    return f"({held_query(deployment, namespace)}) + on() ({in_flight_query(deployment, namespace)})"


def wake_trigger(deployment: str, namespace: str, prometheus_url: str, capacity: int) -> dict[str, Any]:
    """Active while any request is held, queued or running: KEDA wakes the deployment on it and
    never idles it to zero under it. Every KEDA trigger is also a metric of the HPA KEDA owns: this
    one asks a replica per `capacity` requests (what one replica's engine takes with its queue,
    render/router/limits.py), so a burst held at zero asks for enough replicas at the HPA's next
    sync; above zero the serving metric usually asks first."""
    return {
        "type": "prometheus",
        "name": WAKE_TRIGGER,
        "metricType": "AverageValue",
        "metadata": {
            "serverAddress": prometheus_url,
            "query": wake_query(deployment, namespace),
            "threshold": str(capacity),
            "activationThreshold": "0",
            # No picker series (the router not scraped) or no serving data while pods are scraped
            # is an error, never 0: KEDA then neither wakes nor idles on a guess.
            "ignoreNullValues": "false",
        },
    }


def push_trigger(deployment: str, namespace: str, capacity: int) -> dict[str, Any]:
    """KEDA's external-push scaler on the router's waker: active the moment a generation request is
    held there, which KEDA acts on at once (scale from zero), no scrape or poll between. Its HPA
    metric is the held requests, a replica per `capacity` as `wake`'s. A waker KEDA cannot reach
    makes this trigger fail, and `wake` still wakes the deployment (KEDA activates on any active
    trigger while another fails)."""
    return {
        "type": "external-push",
        "name": PUSH_TRIGGER,
        "metricType": "AverageValue",
        "metadata": {
            "scalerAddress": f"{names.router(deployment)}.{namespace}.svc:{PUSH_PORT}",
            CAPACITY_KEY: str(capacity),
        },
    }


def keda_timing(zero: ScaleToZeroSpec) -> dict[str, int]:
    """ScaledObject fields: poll often (a request at zero waits for the poll), and idle the
    deployment after idleSeconds without activity, a new one too (KEDA would otherwise idle a new
    ScaledObject's target at its first inactive poll: initialCooldownPeriod defaults to 0)."""
    return {
        "pollingInterval": POLLING_SECONDS,
        "cooldownPeriod": zero.idle_seconds,
        "initialCooldownPeriod": zero.idle_seconds,
    }


def derived_hold(cold_start_s: int | None) -> int:
    """The hold of a deployment without holdSeconds: its last cold start times the factor, rounded
    up to the step, within the default and the ceiling; the default before a start is measured.
    The factor leaves room for the wake-up before the pod exists (the direct wake-up's fraction of
    a second, a scrape and a poll without it) and for a start slower than the one measured (another
    node, a busier one); the step keeps a start a few seconds off from changing it."""
    if cold_start_s is None:
        return DEFAULT_HOLD_SECONDS
    steps = math.ceil(cold_start_s * HOLD_COLD_START_FACTOR / HOLD_STEP_SECONDS)
    return min(MAX_HOLD_SECONDS, max(DEFAULT_HOLD_SECONDS, steps * HOLD_STEP_SECONDS))


def hold_seconds(zero: ScaleToZeroSpec, cold_start_s: int | None, running: int | None, at_zero: bool) -> int:
    """The hold the router gets: holdSeconds when set (an edit restarts the router, as any edit
    of its configuration), else the derived hold. A change of that one restarts the router too,
    which ends the requests it holds and the streams it carries, and nothing in the spec asked for
    it: so a derived hold the router runs (`running`) is kept until the deployment is at zero
    replicas (KEDA idled it: nothing held or in flight), and there it is only raised. The last cold
    start is one node's: a fast one (the image cached there) would lower the hold below the next
    start on another node, and every request held then would get a 503; a hold too long costs
    little, as the waker ends held requests at once when no replica can start (waker/stall.py)."""
    if zero.hold_seconds is not None:
        return zero.hold_seconds
    derived = derived_hold(cold_start_s)
    if running is None:
        return derived
    return max(running, derived) if at_zero else running


def router_hold(ld: LLMDeployment, running: int | None = None) -> int | None:
    """The deployment's hold from its spec and status.lastColdStart; None without scale to zero.
    `running`: the derived hold of the router's applied ConfigMap (running_hold)."""
    zero = ld.spec.autoscaling.zero if ld.spec.autoscaling is not None else None
    if zero is None:
        return None
    last = ld.status.last_cold_start if ld.status is not None else None
    cold = last.total_seconds if last is not None else None
    return hold_seconds(zero, cold, running, at_zero=ld.spec.replicas == 0)


def hold_annotations(zero: ScaleToZeroSpec, hold: int) -> dict[str, str]:
    """The router ConfigMap's record of a derived hold, which the next reconcile keeps (its data
    is not kept in the operator's cache, only digests of it)."""
    return {L.DERIVED_HOLD: str(hold)} if zero.hold_seconds is None else {}


def running_hold(config_map: dict[str, Any] | None) -> int | None:
    """The derived hold an applied router ConfigMap records; None for none (the router not made yet,
    a hold set in the spec, an operator before this record) or a value the operator cannot have
    written."""
    value = ((config_map or {}).get("metadata", {}).get("annotations") or {}).get(L.DERIVED_HOLD, "")
    if not value.isdigit() or not DEFAULT_HOLD_SECONDS <= int(value) <= MAX_HOLD_SECONDS:
        return None
    return int(value)


def flow_control(zero: ScaleToZeroSpec, hold: int) -> dict[str, Any]:
    """The EndpointPickerConfig fields that hold requests (GIE v1.5.0
    apix/config/v1alpha1/endpointpickerconfig_types.go FlowControlConfig): the gate, the hold as the
    default request TTL (`hold`: a held request is answered 503 past it), and the bound on held requests,
    globally and per priority band (the band's own default is 5,000: pkg/epp/flowcontrol/registry/
    config.go); one more is answered 429. Everything else is upstream's default: fcfs ordering and
    global-strict fairness, so requests leave in arrival order."""
    bound = str(zero.max_held_requests)
    return {
        "featureGates": [FLOW_CONTROL_GATE],
        "flowControl": {
            "maxRequests": bound,
            "defaultRequestTTL": f"{hold}s",
            "defaultPriorityBand": {"priority": 0, "maxRequests": bound},
        },
    }
