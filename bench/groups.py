"""P14, group recovery (issue 36): from a fault of one member of a multi-node group to the group
serving again, beside a single pod's recovery from the same fault, on the embedded cluster's real
node with its own operator (the world of tests/e2e/test_cpu_multi_node.py: e2e/group_world.py).

tiny-llama split over two CPU pods (tensor 1 x pipeline 2, 250m each) runs as two groups: group 0
takes each fault while group 1 is asked over and over at its own leader (goal: 0 failed). One pod of
the same weights takes the same fault. A recovery lasts from the fault to the first reference answer,
at the leader's (the pod's) own address, from a serving process started after the fault (a new pod,
or its container restarted); every answer meanwhile is checked against the reference text.

  fault                group 0                                single pod
  killed pod           its worker pod force-deleted           the pod force-deleted
  rank exit            rank 1 ends (SIGTERM)                  its tritonserver ends (SIGTERM)
  launch agent killed  the worker's launch agent (SIGTERM)    (none: the rank exit's figure)
  frozen rank          rank 1 stopped (SIGSTOP)               its tritonserver stopped (SIGSTOP)
  deleted leader       the leader pod force-deleted           (the killed pod's figure)

Each fault starts from pods that never restarted (any that did are deleted and awaited first), so
the kubelet's restart back-off from an earlier fault never lengthens a later one, on either side.
Goal: the group's time <= 1.5 times the single pod's, for each fault. Beside it, how long each side
was unavailable to its client (first failed request -> right answer): a group's old world may serve
on for seconds after the fault (a killed worker's processes end after its preStop drain).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

import openai
from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.modelrepo import weights_seed
from llm_operator.runtime.cpu_reference import TINY_MODELS
from llm_operator.runtime.cpu_reference.tiny_lm import TinyLM

from bench.world import operator_in
from e2e.cluster.testing import Kubectl, pod_ready, wait_for
from e2e.group_faults import AGENT, RANK, TRITON, Other, signal_in
from e2e.group_world import (
    MAX_TOKENS,
    MODEL,
    PROMPT,
    READY_TIMEOUT,
    SINGLE,
    SPLIT,
    STALL_TIMEOUT,
    World,
    deployment,
    fresh,
    generation,
    split_deployment,
)

NAMESPACE = "bench-groups"
GOAL = 1.5
LEADER, OTHER_LEADER, WORKER = f"{SPLIT}-0", f"{SPLIT}-1", f"{SPLIT}-g0-1"
GROUP_0 = (LEADER, WORKER)


@dataclass
class Timed:
    seconds: float
    wrong: int  # answers meanwhile that were not the reference text
    phases: dict[str, float]  # what happened when, in seconds from the fault (as polled)
    others_asked: int = 0
    others_failed: int = 0

    @property
    def unavailable(self) -> float:
        """From the first failed request to the right answer: what a client saw down (a world
        that serves on after the fault is not down)."""
        return self.seconds - self.phases.get("down", self.seconds)

    def said(self) -> str:
        return ", ".join(f"{what} {at:.1f}" for what, at in sorted(self.phases.items(), key=lambda p: p[1]))


def timed(world: World, kubectl: Kubectl, members: tuple[str, ...], fault: Callable[[], object]) -> Timed:
    """Cause `fault`; ask `members[0]` until a process started after it gives the reference text.
    Phases: the first failed request, and each member's new process (pod or container) and its
    Ready."""
    ns = world.namespace
    before = {m: generation(kubectl.get("pod", m, ns)) for m in members}
    fault()
    start, wrong, phases = time.monotonic(), 0, dict[str, float]()

    def seen(what: str) -> None:
        phases.setdefault(what, time.monotonic() - start)

    while time.monotonic() - start < READY_TIMEOUT:
        pods = {m: kubectl.get("pod", m, ns) for m in members}
        for m, pod in pods.items():
            if generation(pod) not in (None, before[m]):
                seen(f"{m} new")
                if pod_ready(pod):
                    seen(f"{m} Ready")
        pod = pods[members[0]]
        try:
            if pod is None or not (pod.get("status") or {}).get("podIP"):
                raise ConnectionError("no pod")
            text = world.answer_at(pod, timeout=STALL_TIMEOUT + 10)
        except (openai.APIError, OSError):  # refused, reset, timed out: not serving
            seen("down")
            time.sleep(0.25)
            continue
        if text != world.want:
            wrong += 1
        elif generation(pod) != before[members[0]]:
            seen("answered")
            return Timed(time.monotonic() - start, wrong, phases)
        time.sleep(0.25)
    raise AssertionError(f"{members[0]} not serving again {READY_TIMEOUT} s after the fault: {phases}")


def group_fault(world: World, kubectl: Kubectl, fault: Callable[[], object]) -> Timed:
    fresh(world, kubectl, GROUP_0)
    other = lambda: world.answer_at(kubectl.get("pod", OTHER_LEADER, world.namespace) or {}, 30)  # noqa: E731
    with Other(other, world.want) as others:
        got = timed(world, kubectl, GROUP_0, fault)
    got.others_asked, got.others_failed = others.asked, len(others.failed)
    return got


def single_fault(world: World, kubectl: Kubectl, fault: Callable[[], object]) -> Timed:
    fresh(world, kubectl, (f"{SINGLE}-0",))
    return timed(world, kubectl, (f"{SINGLE}-0",), fault)


def run(print_fn: Callable[[str], None] = print) -> None:
    began = time.monotonic()
    split = split_deployment()
    split["spec"]["replicas"] = 2
    spec = LLMDeploymentSpec.model_validate(split["spec"])
    lm = TinyLM(TINY_MODELS[MODEL], weights_seed(spec.model.revision or "main"))
    want = "".join(lm.generate(PROMPT, MAX_TOKENS))
    with operator_in(NAMESPACE, (18960, 18961), print_fn) as (cluster, kubectl):
        world = World(NAMESPACE, cluster, want)
        for doc in (split, deployment(SINGLE)):
            kubectl.apply(doc, namespace=NAMESPACE)
        for name in (SPLIT, SINGLE):
            wait_for(f"{name} Ready", lambda n=name: kubectl.get("llmdeployment", n, NAMESPACE) or {},  # type: ignore[misc]
                     lambda d: (d.get("status") or {}).get("readyReplicas") == d["spec"]["replicas"],
                     timeout=READY_TIMEOUT)  # fmt: skip
        ns = NAMESPACE

        def kill(pod: str) -> Callable[[], object]:
            return lambda: kubectl("delete", "pod", pod, "--grace-period=0", "--force", "--wait=false",
                                   namespace=ns)  # fmt: skip

        def send(pod: str, argv: str, sig: int) -> Callable[[], object]:
            return lambda: signal_in(kubectl, ns, pod, argv, sig)

        single_pod = f"{SINGLE}-0"
        singles = {
            "killed pod": single_fault(world, kubectl, kill(single_pod)),
            "rank exit": single_fault(world, kubectl, send(single_pod, TRITON, signal.SIGTERM)),
            "frozen rank": single_fault(world, kubectl, send(single_pod, TRITON, signal.SIGSTOP)),
        }
        faults = {
            "killed pod": (kill(WORKER), "killed pod"),
            "rank exit": (send(WORKER, RANK, signal.SIGTERM), "rank exit"),
            "launch agent killed": (send(WORKER, AGENT, signal.SIGTERM), "rank exit"),
            "frozen rank": (send(WORKER, RANK, signal.SIGSTOP), "frozen rank"),
            "deleted leader": (kill(LEADER), "killed pod"),
        }
        rows = []
        for what, (fault, beside) in faults.items():
            group, single = group_fault(world, kubectl, fault), singles[beside]
            ratio = group.seconds / single.seconds
            rows.append((what, group, beside, single, ratio))
            print_fn(f"P14 {what}: the group {group.seconds:.1f} s, a single pod ({beside}) "
                     f"{single.seconds:.1f} s: {ratio:.2f}x (goal <= {GOAL}x); group 1 answered "
                     f"{group.others_asked} requests meanwhile, {group.others_failed} failed; wrong "
                     f"answers {group.wrong} (group), {single.wrong} (single); the group's phases: "
                     f"{group.said()}; the single pod's: {single.said()}")  # fmt: skip
    print_fn("P14 group recovery (fault -> serving again), two 250m pods per group vs one 250m pod:")
    print_fn(f"  {'fault':<20} {'group':>7} {'single':>7} {'ratio':>6}  unavailable (group / single)  "
             "other group failed / asked")  # fmt: skip
    for what, group, _, single, ratio in rows:
        met = "met" if ratio <= GOAL else "not met"
        print_fn(f"  {what:<20} {group.seconds:>6.1f}s {single.seconds:>6.1f}s {ratio:>5.2f}x  "
                 f"{group.unavailable:>5.1f}s / {single.unavailable:>5.1f}s {'':>13}"
                 f"{group.others_failed} / {group.others_asked} ({met})")  # fmt: skip
    print_fn(f"groups bench: {time.monotonic() - began:.0f} s in all")


if __name__ == "__main__":
    run()
