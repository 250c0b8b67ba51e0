"""P15 and P16, scale to zero on the embedded cluster's real node with KEDA's real controller, GIE's
picker holding requests in its flow control and the router's waker (the world of
tests/e2e/test_scale_to_zero.py: e2e/keda_world.py, e2e/zero_world.py), its own operator.

P15, the wake-up overhead: a streamed completion sent at zero replicas, from sending to its first
token, less the serving pod's own time from its creation to Ready; goal <= 2 s. Each round waits
for the deployment back at zero, then sends one request, and prints the phases: the request held
as Prometheus sees the picker's queue, KEDA asking for a replica (the LLMDeployment's replicas),
the pod created, scheduled, started (its containers running), Ready, the first token. The pod's
phases are as polled from the API every 0.25 s (both ends of creation -> Ready lag the same), the
API's own timestamps (to the second) beside them. For a single-pod deployment
(examples/cpu-reference-scale-to-zero.yaml) and a multi-node one (tensor 1 x pipeline 2, two CPU
pods, as tests/e2e/test_cpu_multi_node.py).

P16, a held burst: BURST streamed completions arriving within 1 s at zero (one thread each, so the
client's concurrency is BURST; each with the hold plus 60 s as its timeout): failed (an error, or a
text other than the model's), first-token p50/p99, and the dispatch order: pairs of requests whose
first tokens came in the order they were sent (the client's timing; first tokens less than TIE_S
apart count as one dispatch, as a batch's first tokens come together).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.modelrepo import weights_seed
from llm_operator.render import names
from llm_operator.runtime.cpu_reference import TINY_MODELS
from llm_operator.runtime.cpu_reference.tiny_lm import TinyLM

from bench.world import REPO, operator_in
from e2e import keda_world
from e2e.cluster.launcher import Cluster
from e2e.cluster.testing import Kubectl, WaitTimeout, wait_for
from e2e.zero_world import POD_PHASES, Phases, Router, Streamed, at_zero, stream

NAMESPACE = "bench-zero"
SINGLE, SPLIT = "tiny-llama-zero", "tiny-pp-zero"
IDLE_S, HOLD_S = 30, 180  # the shortest idle window admission allows; above a cold start here
ROUNDS = {SINGLE: 3, SPLIT: 2}
BURST, WITHIN_S = 200, 1.0
TIE_S = 0.05
GOAL_S = 2.0
NAN = float("nan")
PROMPT, MAX_TOKENS = "Once upon a time", 8
BODY = {"model": "tiny-llama", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}
PHASES = ("held", "replicas", *POD_PHASES)
LABELS = {"held": "held (metric)", "replicas": "KEDA asked", "created": "pod created",
          "scheduled": "scheduled", "started": "started", "ready": "Ready"}  # fmt: skip


def deployments() -> list[dict[str, Any]]:
    """The example at zero (one replica at most: the node's 2 CPUs also run the routers, KEDA and
    the control plane) and the same model split over two pods of 250m CPU each."""
    single: dict[str, Any] = yaml.safe_load(
        (REPO / "examples" / "cpu-reference-scale-to-zero.yaml").read_text()
    )
    single["spec"]["autoscaling"].update(
        maxReplicas=1, scaleToZero={"idleSeconds": IDLE_S, "holdSeconds": HOLD_S, "maxHeldRequests": 1000}
    )
    split: dict[str, Any] = yaml.safe_load(yaml.safe_dump(single))
    split["metadata"]["name"] = SPLIT
    split["spec"]["parallelism"] = {"tensor": 1, "pipeline": 2}
    split["spec"]["engine"]["cpuReference"] = {"contract": "pytorch"}  # the contract that splits layers
    split["spec"]["resources"]["cpu"] = "250m"
    return [single, split]


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile (q in 0-100) of values; nan without any."""
    ordered = sorted(values)
    if not ordered:
        return NAN
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n q / 100), at least the first
    return ordered[int(rank) - 1]


@dataclass(frozen=True)
class Order:
    pairs: int  # pairs of requests whose first tokens are more than TIE_S apart
    in_order: int  # of them, the earlier sent got its first token first
    most_overtaken: int  # the most requests sent after one that got their first token before it


def dispatch_order(sent: Sequence[float], first: Sequence[float], tie_s: float = TIE_S) -> Order:
    """How far the first tokens' order follows the sending order (request i sent at sent[i], its
    first token at first[i])."""
    pairs = in_order = 0
    overtaken = [0] * len(sent)
    for i in range(len(sent)):
        for j in range(len(sent)):
            if sent[i] < sent[j] and abs(first[i] - first[j]) > tie_s:
                pairs += 1
                if first[i] < first[j]:
                    in_order += 1
                else:
                    overtaken[i] += 1
    return Order(pairs, in_order, max(overtaken, default=0))


def overhead(sent: float, first_token: float, created: float, ready: float) -> float:
    """P15: request -> first token, less the pod's own creation -> Ready."""
    return (first_token - sent) - (ready - created)


@dataclass
class Round:
    name: str
    answer: Streamed
    seen: dict[str, float]  # phase -> seconds after sending, as polled
    api: dict[str, float]  # pod phase -> seconds after sending, the API's timestamps

    @property
    def overhead(self) -> float:
        token = self.answer.first_token
        if token is None or "created" not in self.seen or "ready" not in self.seen:
            return NAN
        return overhead(0.0, token, self.seen["created"], self.seen["ready"])


def _router(kubectl: Kubectl, cluster: Cluster, name: str) -> Router:
    service = kubectl.get("service", names.router(name), NAMESPACE)
    assert service is not None, f"{name}: no router Service"
    return Router(cluster.netns, service["spec"]["clusterIP"])


def _at_zero(kubectl: Kubectl, names_: Sequence[str]) -> bool:
    """Every one of them at zero: another's pods would share the node's CPUs with the one woken."""
    return all(at_zero(kubectl, NAMESPACE, name) is not None for name in names_)


def one_round(kubectl: Kubectl, cluster: Cluster, name: str, others: Sequence[str]) -> Round:
    """`name` and `others` at zero, then one streamed request to `name`."""
    wait_for("the deployments at zero", lambda: _at_zero(kubectl, [name, *others]), timeout=IDLE_S + 120)
    answer = Streamed(0.0)
    with Phases(kubectl, cluster.prometheus_url, NAMESPACE, name) as phases:
        answer.sent = time.time()
        stream(_router(kubectl, cluster, name), BODY, answer, HOLD_S + 60)
    seen = {phase: at - answer.sent for phase, at in phases.first.items()}
    api = {phase: at - answer.sent for phase, at in phases.api_times().items()}
    return Round(name, answer, seen, api)


def burst(kubectl: Kubectl, cluster: Cluster, others: Sequence[str]) -> tuple[list[Streamed], Phases]:
    """BURST streamed requests to SINGLE at zero, the i-th sent i * WITHIN_S / BURST s after the
    first."""
    wait_for("the deployments at zero", lambda: _at_zero(kubectl, [SINGLE, *others]), timeout=IDLE_S + 120)
    router = _router(kubectl, cluster, SINGLE)
    answers = [Streamed(0.0) for _ in range(BURST)]
    start = time.time() + 0.5  # every thread started before the first is due

    def send(i: int) -> None:
        time.sleep(max(0.0, start + i * WITHIN_S / BURST - time.time()))
        answers[i].sent = time.time()
        stream(router, BODY, answers[i], HOLD_S + 60)

    threads = [threading.Thread(target=send, args=(i,), daemon=True) for i in range(BURST)]
    with Phases(kubectl, cluster.prometheus_url, NAMESPACE, SINGLE) as phases:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=HOLD_S + 90)
    return answers, phases


def _why_not_zero(kubectl: Kubectl, name: str) -> str:
    """What the deployment and its pods say, when it did not reach zero."""
    ld = kubectl.get("llmdeployment", name, NAMESPACE) or {}
    said = "; ".join(f"{c['type']}={c['status']} {c.get('reason', '')}: {c.get('message', '')}"[:300]
                     for c in (ld.get("status") or {}).get("conditions") or [])  # fmt: skip
    pods = [
        p["metadata"]["name"] for p in kubectl.items("pods", NAMESPACE, f"llmoperator.io/deployment={name}")
    ]
    return f"spec.replicas {ld.get('spec', {}).get('replicas')}, pods {pods}; {said}"


def _print_round(print_fn: Callable[[str], None], r: Round, want: str) -> None:
    token = NAN if r.answer.first_token is None else r.answer.first_token
    steps = ", ".join(f"{LABELS[p]} {r.seen[p]:.1f}" for p in PHASES if p in r.seen)
    api = ", ".join(f"{LABELS[p]} {r.api[p]:.0f}" for p in POD_PHASES if p in r.api)
    wrong = (r.answer.status, r.answer.text) != (200, want)
    said = f"; WRONG ANSWER {r.answer.status}: {r.answer.text[:200]}" if wrong else ""
    own = r.seen.get("ready", NAN) - r.seen.get("created", NAN)
    api_own = r.api.get("ready", NAN) - r.api.get("created", NAN)
    print_fn(f"zero bench (P15, {r.name}): request -> {steps}, first token {token:.1f} s "
             f"(the API's timestamps: {api} s); pod creation -> Ready {own:.1f} s; wake-up overhead "
             f"{r.overhead:.1f} s ({token - api_own:.1f} s by the API's timestamps){said}")  # fmt: skip


def _print_p15(print_fn: Callable[[str], None], rounds: list[Round]) -> None:
    for name in ROUNDS:
        ran = [r.overhead for r in rounds if r.name == name]
        figures = [f for f in ran if not math.isnan(f)]  # nan: a phase never seen (a failed round)
        if not ran:
            continue
        median = percentile(figures, 50)
        each = ", ".join(f"{f:.1f}" for f in figures)
        within = "within" if median <= GOAL_S else "OVER"
        print_fn(f"zero bench (P15, {name}): wake-up overhead {each} s ({len(figures)} of {len(ran)} rounds "
                 f"measured), median {median:.1f} s, ratio to the goal {median / GOAL_S:.2f} ({within} the "
                 f"goal <= {GOAL_S:g} s)")  # fmt: skip


def _print_p16(print_fn: Callable[[str], None], answers: list[Streamed], phases: Phases, want: str) -> None:
    failed = [a for a in answers if (a.status, a.text) != (200, want) or a.first_token is None]
    good = [a for a in answers if a not in failed]
    firsts = [a.first_token for a in good if a.first_token is not None]
    spread = max(a.sent for a in answers) - min(a.sent for a in answers)
    order = dispatch_order([a.sent for a in good], [a.sent + (a.first_token or 0.0) for a in good])
    share = order.in_order / order.pairs if order.pairs else NAN
    print_fn(f"zero bench (P16): {BURST} streamed requests sent at zero within {spread:.2f} s: failed "
             f"{len(failed)} (goal 0 within the {HOLD_S} s hold); first token p50 "
             f"{percentile(firsts, 50):.1f} s, p99 {percentile(firsts, 99):.1f} s, all within "
             f"{min(firsts, default=NAN):.1f}-{max(firsts, default=NAN):.1f} s")  # fmt: skip
    print_fn(f"zero bench (P16): dispatch order (first tokens by the client's clock, ties under "
             f"{TIE_S * 1000:.0f} ms left out): {order.in_order} of {order.pairs} pairs in arrival "
             f"order ({share:.3f}); at most {order.most_overtaken} later arrivals served before an "
             "earlier one")  # fmt: skip
    first = min(a.sent for a in answers)
    steps = ", ".join(f"{LABELS[p]} {phases.first[p] - first:.1f}" for p in PHASES if p in phases.first)
    print_fn(f"zero bench (P16): after the first request: {steps} s; the picker held up to "
             f"{phases.held:g} at a scrape")  # fmt: skip
    for a in failed[:3]:
        print_fn(f"zero bench (P16): a failed request: {a.status} {a.text[:200]}")


def _split_at_zero(kubectl: Kubectl, print_fn: Callable[[str], None]) -> bool:
    """Whether the multi-node deployment reached zero; if not, why (then it is removed, so that its
    pods leave the node's CPUs to the single pod's rounds)."""
    try:
        wait_for(f"{SPLIT} at zero", lambda: at_zero(kubectl, NAMESPACE, SPLIT), timeout=IDLE_S + 150)
    except WaitTimeout:
        print_fn(f"zero bench (P15, {SPLIT}): NOT at zero {IDLE_S + 150} s after it was created: "
                 f"{_why_not_zero(kubectl, SPLIT)}")  # fmt: skip
        kubectl.delete("llmdeployment", SPLIT, NAMESPACE, wait=True)
        return False
    return True


def run(print_fn: Callable[[str], None] = print) -> None:
    began = time.monotonic()
    spec = LLMDeploymentSpec.model_validate(deployments()[0]["spec"])
    lm = TinyLM(TINY_MODELS["tiny-llama"], weights_seed(spec.model.revision or "main"))
    want = "".join(lm.generate(PROMPT, MAX_TOKENS))
    with (
        operator_in(NAMESPACE, (18950, 18951), print_fn) as (cluster, kubectl),
        keda_world.running(cluster, kubectl, print_fn),
    ):
        for doc in deployments():
            kubectl.apply(doc, namespace=NAMESPACE)
        others = [SPLIT] if _split_at_zero(kubectl, print_fn) else []
        rounds = []
        for _ in range(ROUNDS[SINGLE]):
            rounds.append(one_round(kubectl, cluster, SINGLE, others))
            _print_round(print_fn, rounds[-1], want)
        answers, held = burst(kubectl, cluster, others)
        for _ in range(ROUNDS[SPLIT] if others else 0):
            try:
                rounds.append(one_round(kubectl, cluster, SPLIT, [SINGLE]))
            except WaitTimeout as e:
                print_fn(f"zero bench (P15, {SPLIT}): the round did not end: {str(e)[:300]}; "
                         f"{_why_not_zero(kubectl, SPLIT)}")  # fmt: skip
                break
            _print_round(print_fn, rounds[-1], want)
        _print_p15(print_fn, rounds)
        _print_p16(print_fn, answers, held, want)
    print_fn(f"zero bench: {time.monotonic() - began:.0f} s in all (KEDA's install and removal included)")


if __name__ == "__main__":
    run()
