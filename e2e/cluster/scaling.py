"""One autoscaling run on real pods, shared by tests/e2e/test_autoscaling.py and `make bench` (P5):
a load step on an autoscaled cpu-reference LLMDeployment, the HPA scaling it through its scale
subresource, the new replica Ready and serving, the load dropping to a trickle and the HPA scaling
back down while requests keep flowing (the drain), with every timestamp recorded.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from llm_operator.contract import OPENAI_PORT

from e2e.cluster import monitoring, netns
from e2e.cluster.load import Load, LoadStats, prometheus_query
from e2e.cluster.testing import Kubectl, pod_ready, wait_for

DEPLOYMENT_LABEL = "llmoperator.io/deployment"
LEADER_LABEL = "llmoperator.io/role=leader"
METRIC = "triton_pending_requests"
# The load step and the trickle kept up during the scale-down; bounded in count and time.
LOAD_CONCURRENCY = 24
TRICKLE_CONCURRENCY = 2
MAX_REQUESTS = 20_000
MAX_SECONDS = 420.0


def autoscaled(doc: dict[str, Any], target: str = "2", scale_down_window_s: int = 15) -> dict[str, Any]:
    """A cpu-reference LLMDeployment manifest with autoscaling on pending requests (min 1, max 3)
    and a short scale-down stabilization, so the run ends in reasonable time."""
    doc["spec"]["autoscaling"] = {
        "minReplicas": 1,
        "maxReplicas": 3,
        "metric": "pending-requests",
        "target": target,
        "behavior": {"scaleDown": {"stabilizationWindowSeconds": scale_down_window_s}},
    }
    return doc


def custom_metric_path(namespace: str, name: str) -> str:
    return (
        f"/apis/{monitoring.CUSTOM_METRICS_GROUP}/v1beta2/namespaces/{namespace}/pods/*/{METRIC}"
        f"?labelSelector={DEPLOYMENT_LABEL}%3D{name}"
    )


def custom_metric(kubectl: Kubectl, namespace: str, name: str) -> dict[str, float]:
    """pod -> value, as the HPA reads it through the aggregation layer."""
    raw = json.loads(kubectl("get", "--raw", custom_metric_path(namespace, name)).stdout)
    out: dict[str, float] = {}
    for item in raw["items"]:
        value = item["value"]
        out[item["describedObject"]["name"]] = (
            float(value[:-1]) / 1000 if value.endswith("m") else float(value)
        )
    return out


def serving_pods(kubectl: Kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    return kubectl.items("pods", namespace, f"{DEPLOYMENT_LABEL}={name},{LEADER_LABEL}")


def served(prometheus: str, namespace: str) -> dict[str, float]:
    """pod -> successful inference requests (Triton's own counter, summed over its models)."""
    result = prometheus_query(
        prometheus, f'sum by (pod) (nv_inference_request_success{{namespace="{namespace}"}})'
    )
    return {dict(labels)["pod"]: value for labels, value in result.items()}


@dataclass
class Timeline:
    """Seconds since the load step (monotonic clock), and what was observed."""

    scale_asked_s: float = 0.0  # the LLMDeployment's spec.replicas > 1 (the HPA wrote /scale)
    replicas_asked: int = 0
    new_created_s: float = 0.0  # the first new serving pod exists (operator + StatefulSet controller)
    new_ready_s: float = 0.0  # the first new serving pod Ready
    new_pod: str = ""
    new_pod_served: float = 0.0  # its own Triton success counter, in Prometheus
    load_dropped_s: float = 0.0
    scaled_down_s: float = 0.0  # spec.replicas back to 1 and only one serving pod left
    stats: LoadStats = field(default_factory=LoadStats)
    notes: list[str] = field(default_factory=list)


def run(
    kubectl: Kubectl,
    ns: str,
    prometheus: str,
    namespace: str,
    name: str,
    log: Callable[[str], None] = print,
    phase_timeout: float = 180.0,
) -> Timeline:
    """Drive one scale-up and scale-down of LLMDeployment `namespace/name` (Ready, autoscaled,
    1 replica, its custom metric already served). `ns`: the cluster's network namespace."""
    svc = kubectl.get("service", name, namespace)
    assert svc is not None, f"Service {namespace}/{name} missing"
    ip = svc["spec"]["clusterIP"]
    before = {p["metadata"]["name"] for p in serving_pods(kubectl, namespace, name)}
    timeline = Timeline()
    # Through the OpenAI API, what clients use: the same load on either Triton contract.
    spec = (kubectl.get("llmdeployment", name, namespace) or {})["spec"]["model"]
    load = Load(
        ns, ip, OPENAI_PORT, concurrency=LOAD_CONCURRENCY, max_requests=MAX_REQUESTS,
        max_seconds=MAX_SECONDS, openai_model=spec.get("alias") or spec["name"],
    )  # fmt: skip
    start = time.monotonic()

    def since() -> float:
        return time.monotonic() - start

    def until(what: str, probe: Callable[[], Any], ok: Callable[[Any], bool] = bool) -> Any:
        if load.done:
            raise AssertionError(f"the load ran out of requests or time before {what}: {load.stats}")
        return wait_for(what, probe, ok, timeout=phase_timeout, interval=0.25)

    with load:
        ld = until(
            "the HPA to scale the LLMDeployment up",
            lambda: kubectl.get("llmdeployment", name, namespace),
            lambda o: o is not None and o["spec"]["replicas"] > 1,
        )
        timeline.scale_asked_s, timeline.replicas_asked = since(), ld["spec"]["replicas"]
        log(
            f"scale: replicas -> {timeline.replicas_asked} {timeline.scale_asked_s:.1f} s after the load step"
        )
        until(
            "a new serving pod created",
            lambda: [
                p for p in serving_pods(kubectl, namespace, name) if p["metadata"]["name"] not in before
            ],
        )
        timeline.new_created_s = since()
        new = until(
            "a new serving pod Ready",
            lambda: [
                p
                for p in serving_pods(kubectl, namespace, name)
                if p["metadata"]["name"] not in before and pod_ready(p)
            ],
        )
        timeline.new_ready_s, timeline.new_pod = since(), new[0]["metadata"]["name"]
        log(f"scale: new replica {timeline.new_pod} Ready {timeline.new_ready_s:.1f} s after the load step")
        counts = until(
            f"{timeline.new_pod} to serve requests (its Triton counter in Prometheus)",
            lambda: served(prometheus, namespace),
            lambda c: c.get(timeline.new_pod, 0) > 0,
        )
        timeline.new_pod_served = counts[timeline.new_pod]
        load.set_concurrency(TRICKLE_CONCURRENCY)
        timeline.load_dropped_s = since()
        log(f"scale: load down to {TRICKLE_CONCURRENCY} at {timeline.load_dropped_s:.1f} s; served {counts}")
        until(
            "the HPA to scale back to 1 replica and the extra pods to go (drained)",
            lambda: (
                kubectl.get("llmdeployment", name, namespace),
                serving_pods(kubectl, namespace, name),
            ),
            lambda r: r[0] is not None and r[0]["spec"]["replicas"] == 1 and len(r[1]) == 1,
        )
        timeline.scaled_down_s = since()
        log(f"scale: back to 1 replica at {timeline.scaled_down_s:.1f} s")
    timeline.stats = load.stats
    log(f"scale: requests ok {load.stats.ok}, failed {load.stats.failed} {load.stats.errors[:3]}")
    return timeline


@contextlib.contextmanager
def prometheus_unreachable(ns: str) -> Iterator[None]:
    """Prometheus gone, as its clients see it: connections to it are refused (an nftables table of
    our own inside the cluster's namespace) until the block exits."""
    table = "llmop_e2e_fault"
    rules = f"""
table inet {table} {{
  chain input {{
    type filter hook input priority -10;
    ip daddr {netns.NODE_IP} tcp dport {monitoring.PROMETHEUS_PORT} reject with tcp reset
  }}
}}
"""
    subprocess.run(netns.command(ns, ["nft", "-f", "-"]), input=rules, text=True, check=True)
    try:
        yield
    finally:
        subprocess.run(netns.command(ns, ["nft", "delete", "table", "inet", table]), check=True)
