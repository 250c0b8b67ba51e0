"""Scale to zero and back (autoscaling.minReplicas 0) with KEDA's real controller, the endpoint
picker's real flow control and a cpu-reference deployment on the real node
(examples/cpu-reference-scale-to-zero.yaml, routing.mode inference-pool, provider keda).

One deployment, in order: it scales to zero after its idle window (no pod left, the status says
so); a burst of requests sent at zero through the router (status.endpoints.openai) is held by the
picker, wakes the deployment through KEDA (on the waker's push: KEDA's event names the external-push
trigger), and is answered with the model's reference text once the first replica is Ready (the test
prints request -> answer against the pod's own creation -> Ready), one of them a streamed request
that gets the router waker's `: waking` comments before its first token if that takes longer than
the waker's first wait; back at zero only after the idle window; with an image the node cannot
pull, held requests end well before the hold with a 503 (or an SSE error event) naming the
status's PodsFailing, and once restored the next request is served; with a hold shorter than a
cold start, the client gets OpenAI's error object with Retry-After.

Needs the embedded cluster (the real node, its monitoring stack scraping the router's picker).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.contract import OPENAI_PORT
from llm_operator.modelrepo import weights_seed
from llm_operator.render import names
from llm_operator.render.router.objects import router_pod_labels
from llm_operator.render.scale_to_zero import RETRY_AFTER_SECONDS
from llm_operator.runtime.cpu_reference import TINY_MODELS
from llm_operator.runtime.cpu_reference.tiny_lm import TinyLM
from llm_operator.waker.exchange import FIRST_WAIT_S
from llm_operator.waker.push import METRIC as PUSH_METRIC
from llm_operator.waker.stall import PERIOD_S as WATCH_PERIOD_S
from llm_operator.waker.stall import refusal

from e2e.cluster import netns
from e2e.cluster.testing import E2ECluster, Kubectl, condition, wait_for
from e2e.zero_world import Answer, Phases, Router, Streamed, at_zero, complete, pod_times, stream, timestamp

# Installs KEDA (cluster-wide CRDs, the external metrics API: e2e/keda_world.py).
pytestmark = [pytest.mark.e2e, pytest.mark.exclusive]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cpu-reference-scale-to-zero.yaml"
NAME = "tiny-llama-zero"
IDLE_S = 30  # the shortest idle window admission allows
HOLD_S = 180  # above a cold start on the busy node
BURST = 20
PROMPT, MAX_TOKENS = "Once upon a time", 8
SERVING = f"llmoperator.io/deployment={NAME}"
ROUTER_PODS = ",".join(f"{k}={v}" for k, v in router_pod_labels(NAME).items())


@dataclass
class Zero:
    namespace: str
    router: Router
    prometheus: str
    want: str  # the model's greedy text for PROMPT
    last_answer: float = 0.0  # time.time() of the last answer the burst got


@pytest.fixture(scope="module")
def zero(operator: None, keda_running: None, cluster: E2ECluster, kubectl: Kubectl) -> Iterator[Zero]:
    if cluster.launcher is None:
        pytest.skip("needs the embedded cluster: its real node, its network namespace and Prometheus")
    launcher = cluster.launcher
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["autoscaling"]["scaleToZero"] = {"idleSeconds": IDLE_S, "holdSeconds": HOLD_S,
                                                 "maxHeldRequests": 100}  # fmt: skip
    # One 1-CPU replica: the real node's 2 CPUs also run the router, KEDA and the control plane, and a
    # second replica would only slow the first one's start, which is what is measured.
    doc["spec"]["autoscaling"]["maxReplicas"] = 1
    spec = LLMDeploymentSpec.model_validate(doc["spec"])
    lm = TinyLM(TINY_MODELS["tiny-llama"], weights_seed(spec.model.revision or "main"))
    ns = kubectl.create_namespace("zero")
    try:
        kubectl.apply(doc, namespace=ns)
        ld = wait_for("status.endpoints.openai", lambda: kubectl.get("llmdeployment", NAME, ns),
                      lambda d: bool(((d or {}).get("status") or {}).get("endpoints", {}).get("openai")),
                      timeout=120)  # fmt: skip
        url = urllib.parse.urlsplit(ld["status"]["endpoints"]["openai"])  # type: ignore[index]
        assert (url.hostname, url.port) == (f"{names.router(NAME)}.{ns}.svc", OPENAI_PORT), url
        service = kubectl.get("service", names.router(NAME), ns)
        assert service is not None
        yield Zero(ns, Router(launcher.netns, service["spec"]["clusterIP"]), launcher.prometheus_url,
                   "".join(lm.generate(PROMPT, MAX_TOKENS)))  # fmt: skip
    finally:
        kubectl.delete_namespace(ns)


def _at_zero(kubectl: Kubectl, ns: str) -> dict[str, Any] | None:
    return at_zero(kubectl, ns, NAME)


def _since(value: str) -> float:
    return time.time() - timestamp(value)


def test_an_idle_deployment_scales_to_zero_after_its_idle_window(zero: Zero, kubectl: Kubectl) -> None:
    ld = wait_for("the deployment at zero replicas", lambda: _at_zero(kubectl, zero.namespace), timeout=240)
    scaled = kubectl.get("scaledobject", NAME, zero.namespace)
    assert scaled is not None
    age = _since(scaled["metadata"]["creationTimestamp"])
    print(f"zero: at 0 replicas {age:.1f} s after the ScaledObject was created (idle window {IDLE_S} s)")
    # A new deployment gets the whole window (initialCooldownPeriod) before KEDA idles it.
    assert age >= IDLE_S, age
    active = condition(ld, "AutoscalingActive")
    assert active is not None and (active["status"], active["reason"]) == ("True", "ScaledToZero"), active
    picker = condition(ld, "PickerReady")
    assert picker is not None and picker["status"] == "True", picker
    assert ld is not None and ld["status"]["replicas"] == 0


BODY = {"model": "tiny-llama", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}


def _complete(zero: Zero, answer: Answer, timeout: float) -> None:
    complete(zero.router, BODY, answer, timeout)


def _stream(zero: Zero, answer: Streamed, timeout: float) -> None:
    stream(zero.router, BODY, answer, timeout)


def test_requests_at_zero_are_held_wake_it_and_are_answered(zero: Zero, kubectl: Kubectl) -> None:
    assert _at_zero(kubectl, zero.namespace) is not None, "the previous test leaves it at zero"
    # The last of the burst is a streamed request, read line by line.
    answers = [Answer(0.0) for _ in range(BURST - 1)] + [streamed := Streamed(0.0)]
    threads = [threading.Thread(target=_stream if a is streamed else _complete, args=(zero, a, HOLD_S + 60),
                                daemon=True) for a in answers]  # fmt: skip
    with Phases(kubectl, zero.prometheus, zero.namespace, NAME) as phases:
        for answer, thread in zip(answers, threads, strict=True):
            answer.sent = time.time()
            thread.start()
        for thread in threads:
            thread.join(timeout=HOLD_S + 90)
    got = [(a.status, a.text) for a in answers]
    assert all(answer == (200, zero.want) for answer in got), got
    created, ready = pod_times(kubectl, zero.namespace, NAME)
    first = answers[0]
    asked = phases.first.get("replicas", float("nan")) - first.sent
    waited = sorted(a.done - a.sent for a in answers)
    print(
        f"zero: {BURST} requests held at zero, all answered; the first in {first.done - first.sent:.1f} s "
        f"(replicas asked {asked:.1f} s after it, pod created "
        f"{created - first.sent:.0f} s, Ready {ready - first.sent:.0f} s); the pod's own creation -> Ready "
        f"{ready - created:.0f} s, so the wake-up added {first.done - first.sent - (ready - created):.1f} s; "
        f"answers after {waited[0]:.1f}-{waited[-1]:.1f} s (median {waited[len(waited) // 2]:.1f}); "
        f"the picker held up to {phases.held:g} at a scrape"
    )
    assert phases.held >= 1, "Prometheus never saw a request held by the picker: what woke it?"
    # The direct wake-up: KEDA scaled from zero on the waker's push (the external-push trigger, index
    # 2, whose metric KEDA names s2-held), not on the prometheus wake trigger's poll (s1-...).
    activated = [e["message"] for e in kubectl.events(zero.namespace, names.autoscaler(NAME))
                 if e.get("reason") == "KEDAScaleTargetActivated"]  # fmt: skip
    print(f"zero: KEDA asked for the replica {asked:.2f} s after the first request: {activated}")
    assert activated and all(m.endswith(f"triggered by s2-{PUSH_METRIC}") for m in activated), activated
    # Nothing but comments before the model's tokens; held longer than the waker's first wait (5 s),
    # comments (with the push the first token can come sooner: the waker's unit tests show them).
    lines = [(at, text) for at, text in streamed.lines if text]
    first_data = next(i for i, (_, text) in enumerate(lines) if text.startswith("data: "))
    comments = [at for at, text in lines[:first_data] if text == ": waking"]
    at = ", ".join(f"{t:.1f}" for t in comments)
    print(f"zero: the streamed request got {len(comments)} ': waking' comment(s), at {at} s, its first "
          f"token at {lines[first_data][0]:.1f} s")  # fmt: skip
    assert streamed.headers.get("content-type", "").startswith("text/event-stream"), streamed.headers
    assert all(text == ": waking" for _, text in lines[:first_data]), lines
    assert comments or lines[first_data][0] < FIRST_WAIT_S + 1, lines
    assert lines[-1][1] == "data: [DONE]", lines
    zero.last_answer = max(a.done for a in answers)


def test_it_goes_back_to_zero_only_after_the_idle_window(zero: Zero, kubectl: Kubectl) -> None:
    assert zero.last_answer, "needs the wake-up test before it"
    wait_for("the deployment back at zero", lambda: _at_zero(kubectl, zero.namespace), timeout=IDLE_S + 90)
    after = time.time() - zero.last_answer
    print(f"zero: back at 0 replicas {after:.1f} s after the last answer (idle window {IDLE_S} s)")
    # KEDA saw the last request in flight at most a scrape (2 s) and a poll (2 s) before it ended.
    assert after >= IDLE_S - 4, after


def _refusal_of(answer: Streamed) -> tuple[str, dict[str, Any]]:
    """How a request was refused: ("503", error) as JSON, or ("event", error) as the SSE error event
    in the stream the waker began."""
    if answer.status == 503:
        return "503", json.loads(answer.text)["error"]
    data = [text.removeprefix("data: ") for _, text in answer.lines if text.startswith("data: ")]
    assert answer.status == 200 and data[-1] == "[DONE]" and len(data) == 2, answer
    return "event", json.loads(data[0])["error"]


def test_a_wake_up_that_cannot_succeed_ends_held_requests(zero: Zero, kubectl: Kubectl) -> None:
    """An image the node cannot pull: the woken replica's pod fails (PodsFailing), and the waker,
    reading the status while it holds requests, ends them at once with a 503 naming it, well before
    the hold (docs/autoscaling.md, "Progress while held"). Restored, the next request is served."""
    ns = zero.namespace
    assert _at_zero(kubectl, ns) is not None
    # Not on the node, and no registry at localhost: the pull fails at once (ErrImagePull).
    bad = {"spec": {"runtime": {"image": "localhost/llm-operator/no-such-image:0"}}}
    kubectl("patch", "llmdeployment", NAME, "--type=merge", "-p", json.dumps(bad), namespace=ns)
    answers = [Streamed(time.time()), Streamed(time.time())]
    threads = [threading.Thread(target=f, args=(zero, a, HOLD_S + 60), daemon=True)
               for f, a in zip((_stream, _complete), answers, strict=True)]  # fmt: skip
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=HOLD_S + 90)
        # While the status still says so, a new request is refused at once: no hold.
        late = Streamed(time.time())
        _complete(zero, late, 60)
        degraded = condition(kubectl.get("llmdeployment", NAME, ns), "Degraded") or {}
    finally:
        kubectl("patch", "llmdeployment", NAME, "--type=merge", "-p",
                json.dumps({"spec": {"runtime": {"image": None}}}), namespace=ns)  # fmt: skip
    for name, answer in (("streamed", answers[0]), ("unstreamed", answers[1]), ("arriving late", late)):
        shape, error = _refusal_of(answer)
        took = answer.done - answer.sent
        print(f"zero: an image that cannot be pulled: the {name} request got {shape} after {took:.1f} s "
              f"(hold {HOLD_S} s): {error['message'][:160]}")  # fmt: skip
        assert (error["type"], error["code"]) == ("server_error", "model_not_ready"), error
        assert error["message"].startswith("the deployment cannot start a replica: PodsFailing: "), error
        assert "no-such-image" in error["message"], error
        assert took < 60, took
        if shape == "503":
            assert answer.headers.get("retry-after") == str(RETRY_AFTER_SECONDS), answer.headers
    assert _refusal_of(answers[1])[0] == "503"
    said = datetime.fromisoformat(degraded["lastTransitionTime"]).timestamp() - answers[0].sent
    print(f"zero: the status said PodsFailing {said:.0f} s after the requests were sent (to the second)")
    assert late.done - late.sent < 3, late

    # Restored: once the status no longer says no replica can start, a request is held and served.
    restored = time.time()
    wait_for("a status that allows a wake-up", lambda: kubectl.get("llmdeployment", NAME, ns),
             lambda d: refusal(d or {}) is None, timeout=120)  # fmt: skip
    cleared = time.time() - restored
    time.sleep(WATCH_PERIOD_S)  # the waker's last read, made while it held requests, goes stale
    served = Answer(time.time())
    _complete(zero, served, HOLD_S + 30)
    print(f"zero: restored: the status allowed a wake-up {cleared:.1f} s later; the next request was "
          f"served {served.done - served.sent:.1f} s after it was sent")  # fmt: skip
    assert (served.status, served.text) == (200, zero.want), served
    wait_for("the deployment back at zero", lambda: _at_zero(kubectl, ns), timeout=IDLE_S + 90)


def test_past_the_hold_the_client_gets_an_openai_error_with_retry_after(zero: Zero, kubectl: Kubectl) -> None:
    """A hold shorter than any cold start (1 s): the picker's TTL ends the request, Envoy answers in
    OpenAI's error format. The edit restarts the router only."""
    assert _at_zero(kubectl, zero.namespace) is not None
    router = kubectl.get("deployment", names.router(NAME), zero.namespace)
    assert router is not None
    patch = {"spec": {"autoscaling": {"scaleToZero": {"holdSeconds": 1}}}}
    kubectl("patch", "llmdeployment", NAME, "--type=merge", "-p", json.dumps(patch), namespace=zero.namespace)
    generation = router["metadata"]["generation"]

    def rolled() -> bool:
        """The new router alone: the old one (still holding for HOLD_S) has no pod left."""
        d = kubectl.get("deployment", names.router(NAME), zero.namespace) or {"metadata": {"generation": 0}}
        s, current = d.get("status") or {}, d["metadata"]["generation"]
        pods = kubectl.items("pods", zero.namespace, ROUTER_PODS)
        return (current > generation and s.get("observedGeneration") == current and len(pods) == 1
                and s.get("updatedReplicas") == s.get("readyReplicas") == 1)  # fmt: skip

    wait_for("the router restarted with the 1 s hold", rolled, timeout=120)

    def reaches_router() -> bool:
        """kube-proxy routes the Service to the new router: it drops the old pod's address some
        time after the pod is gone, and a request sent there would wait out its whole timeout."""
        try:
            netns.connect(zero.router.netns, zero.router.ip, OPENAI_PORT, timeout=2).close()
        except OSError:
            return False
        return True

    wait_for("the router's Service reaching the new router", reaches_router, timeout=60)
    answer = Answer(time.time())
    _complete(zero, answer, 60)
    took = answer.done - answer.sent
    retry = answer.headers.get("retry-after")
    print(f"zero: past a 1 s hold: {answer.status} after {took:.1f} s, Retry-After {retry}: {answer.text}")
    assert answer.status == 503, answer
    assert answer.headers.get("retry-after") == str(RETRY_AFTER_SECONDS), answer.headers
    assert answer.headers.get("content-type") == "application/json", answer.headers
    error = json.loads(answer.text)["error"]
    assert (error["type"], error["code"]) == ("server_error", "model_not_ready"), error
    assert "hold of 1 s" in error["message"], error
    assert took < 10, took
