"""Routing under imbalance on the real node, shared by tests/e2e/test_routing.py and `make bench`
(P9): one cpu-reference LLMDeployment with three replicas routed through the endpoint picker
(spec.routing.mode inference-pool), the third one a straggler, slowed by the CPU runtime's
TEST-ONLY fault knob for that pod only (LLMOP_FAULT_PODS). Who served what is read from each
pod's own Triton counters (nv_inference_request_success on its metrics port), never inferred from
the client.

The straggler is a slower GPU pool of a heterogeneous deployment: less capacity, not only a later
answer. CAPACITY makes every token of every sequence in its batch cost SLOW_STEP_MS
(LLMOP_FAULT_STEP_MS), so its two model instances (the latency profile's cpu_model_instances) make
at most 2 x 1000 / 120 = 16.7 tokens/s, 1.04 16-token completions/s: less than the third of P9's
4 requests/s (1.33) a blind choice sends it, so its queue grows, and its load gauges (scheduled
requests, KV-cache blocks) stay up while it works through it. LATENCY (LLMOP_FAULT_TTFT_MS) only
sleeps before each batch's first token: its capacity is not lower, its queue never grows, and a
queue-based picker sees it idle between requests (P9 shows it for comparison)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import yaml
from llm_operator.contract import METRICS_PORT, OPENAI_PORT

from e2e.cluster.testing import Kubectl, is_true, wait_for
from e2e.generate import connection

REPO = Path(__file__).resolve().parents[2]
NAME = "tiny-llama"
MODEL = "tiny-llama"  # the example's alias: what clients ask for
SLOW_POD = f"{NAME}-2"  # the StatefulSet's third replica (pod names are its host names)
SLOW_STEP_MS = 120  # per token per sequence in the straggler's batch
CAPACITY = {"LLMOP_FAULT_STEP_MS": str(SLOW_STEP_MS)}
SLOW_TTFT_MS = 1000  # before each batch's first token
LATENCY = {"LLMOP_FAULT_TTFT_MS": str(SLOW_TTFT_MS)}
# Triton's per-model success counter, for the model every request goes through on either
# contract: tensorrt_llm (the llmapi model, or the engine that the front door and the ensemble call).
_SUCCESS = re.compile(
    r'^nv_inference_request_success\{[^}]*model="tensorrt_llm"[^}]*\}\s+(\S+)', re.MULTILINE
)


def deployment(
    routing: str = "inference-pool",
    replicas: int = 3,
    knob: dict[str, str] = CAPACITY,
    contract: str = "pytorch",
) -> dict[str, Any]:
    """tiny-llama at 250m CPU per pod (three pods and the router fit the real node's 2 CPUs), the
    straggler slowed by `knob` (CAPACITY or LATENCY), its CPU runtime speaking `contract`."""
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "cpu-reference.yaml").read_text())
    doc["spec"]["engine"]["cpuReference"] = {"contract": contract}
    doc["spec"]["resources"]["cpu"] = "250m"
    doc["spec"]["replicas"] = replicas
    doc["spec"]["routing"] = {"mode": routing}
    env = {**knob, "LLMOP_FAULT_PODS": SLOW_POD}
    doc["spec"]["runtime"]["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return doc


def start(
    kubectl: Kubectl, namespace: str, knob: dict[str, str] = CAPACITY, contract: str = "pytorch"
) -> None:
    """Applies deployment() and waits until it is Ready (its pods and its router)."""
    kubectl.apply(deployment(knob=knob, contract=contract), namespace=namespace)
    wait_for(
        "the straggler deployment Ready",
        lambda: kubectl.get("llmdeployment", NAME, namespace),
        lambda o: is_true(o, "Ready"),
        timeout=300,
    )


def stop(kubectl: Kubectl, namespace: str) -> None:
    """Deletes the deployment and waits until its pods and its router's are gone, so that the next
    start() begins afresh under the same names."""
    kubectl.delete("llmdeployment", NAME, namespace, wait=True, timeout=120)

    def left() -> list[Any]:
        pods = kubectl.items("pods", namespace, f"llmoperator.io/deployment={NAME}")
        return pods + [o for o in (kubectl.get("deployment", router(), namespace),) if o is not None]

    wait_for("the straggler deployment's pods and router gone", left, lambda objs: not objs, timeout=180)


def router(name: str = NAME) -> str:
    """The router's Service (Envoy in front of the endpoint picker)."""
    return f"{name}-router"


def cluster_ip(kubectl: Kubectl, namespace: str, service: str) -> str:
    obj = kubectl.get("service", service, namespace)
    assert obj is not None, f"no Service {namespace}/{service}"
    return str(obj["spec"]["clusterIP"])


def pod_ips(kubectl: Kubectl, namespace: str, name: str = NAME) -> dict[str, str]:
    """Serving leader pods by name -> IP."""
    pods = kubectl.items("pods", namespace, f"llmoperator.io/deployment={name},llmoperator.io/role=leader")
    return {p["metadata"]["name"]: p["status"]["podIP"] for p in pods if p.get("status", {}).get("podIP")}


def served(netns: str, ip: str) -> float:
    """Requests the pod's Triton answered successfully so far, from its own metrics endpoint,
    asked from inside the cluster's network."""
    conn = connection(ip, METRICS_PORT, inside=netns, timeout=10)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        text = response.read().decode()
    finally:
        conn.close()
    assert response.status == 200, text[:200]
    return sum(float(v) for v in _SUCCESS.findall(text))


def counts(netns: str, ips: dict[str, str]) -> dict[str, float]:
    return {pod: served(netns, ip) for pod, ip in ips.items()}


def shares(before: dict[str, float], after: dict[str, float]) -> tuple[dict[str, float], float]:
    """Each pod's share of the requests served between two readings, and their total."""
    delta = {pod: after[pod] - before.get(pod, 0.0) for pod in after}
    total = sum(delta.values())
    return ({pod: (d / total if total else 0.0) for pod, d in delta.items()}, total)


def completion(max_tokens: int) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "Once upon a time", "max_tokens": max_tokens}


def completion_seconds(netns: str, ip: str, max_tokens: int) -> float:
    """One completion asked of the pod itself (its front door), timed."""
    conn = connection(ip, OPENAI_PORT, inside=netns, timeout=30)
    body = json.dumps(completion(max_tokens))
    began = time.monotonic()
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
    finally:
        conn.close()
    assert response.status == 200, data[:200]
    return time.monotonic() - began
