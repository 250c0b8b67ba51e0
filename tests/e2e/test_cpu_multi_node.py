"""A cpu-reference model split over the pods of a group on the real node: tiny-llama with
`parallelism: {tensor: 1, pipeline: 2}` runs as two CPU pods (the leader StatefulSet's pod and its
group's worker StatefulSet's), the leader's mpirun starting rank 1 on the worker through the
worker's launch agent, as GPU groups start theirs; the stages exchange activations over gloo
between the pods (runtime/cpu_reference/pipeline.py).

- It becomes Ready and answers the OpenAI API, streamed and not, with exactly the text a
  single-pod deployment of the same weights serves beside it (and the same tiny model decodes in
  this process): the split is real (each pod logs the layers its stage runs), and it changes no
  token.
- A killed worker pod is one group event: the whole world is relaunched (the leader's container
  restarts in place and starts every rank anew on the worker's replacement), never half a group
  serving, the deployment says which member failed and why, and the group serves again. The time
  from the fault to the group's first right answer is printed beside a single-pod deployment's
  recovery from the same fault.
- So are the other faults of a member, each from a group that never restarted (kubectl exec signals
  the process in its pod): a rank that exits, the worker's launch agent killed, a rank frozen
  (SIGSTOP, beside a single pod's frozen tritonserver). Each relaunches the whole world with no rank
  of the old one left, GroupRecreated names the member and its words, and tiny-single meanwhile
  answers every request (but while frozen itself). A deleted leader is replaced alone, every rank of
  the world relaunched through the worker's launch agent (docs/architecture.md, "A broken group
  restarts its world in place").
- Last, as they leave the world as they found it: an HPA (minReplicas 2) adds a whole second group,
  reading its metric from the leaders only, and (maxReplicas 1) takes it away whole, drained, the
  first group untouched; a bad canary (the fault knob) runs as a group of its own, is aborted on its
  leader's error rate and removed whole, and the stable spec rolls it back, the stable group
  untouched. Neither is a group failure (docs/launcher-and-engines.md, "Scaling and canaries").

Two deployments, three pods of group_world.CPU_LIMIT each (five while a second group or a canary's runs): the
node has 2 CPUs for the whole suite.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.contract import OPENAI_PORT
from llm_operator.modelrepo import weights_seed
from llm_operator.runtime.cpu_reference import TINY_MODELS
from llm_operator.runtime.cpu_reference.tiny_lm import TinyLM

from e2e.chat import base_url
from e2e.cluster.canary import Recorder, revisions, with_env
from e2e.cluster.load import Load
from e2e.cluster.scaling import custom_metric
from e2e.cluster.testing import E2ECluster, Kubectl, condition, is_true, pod_ready, wait_for
from e2e.group_faults import (
    AGENT,
    RANK,
    TREE,
    TRITON,
    Other,
    group_events,
    new_group_events,
    signal_in,
    what_the_pods_said,
)
from e2e.group_world import (
    MAX_TOKENS,
    MODEL,
    PROMPT,
    READY_TIMEOUT,
    SINGLE,
    SPLIT,
    Recovery,
    World,
    deployment,
    force_delete,
    fresh,
    generations,
    recover,
    recover_from,
    relaunched,
    split_deployment,
    uids,
)
from tests.e2e import openai_sdk
from tests.e2e.group_scale import (
    HalfGroups,
    autoscaled,
    groups,
    hpa_metric,
    scale_selector,
    since,
    with_canary,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def world(operator: None, cluster: E2ECluster, kubectl: Kubectl) -> Iterator[World]:
    if cluster.launcher is None:
        pytest.skip("needs the embedded cluster: its real node's images and its network namespace")
    doc = split_deployment()
    spec = LLMDeploymentSpec.model_validate(doc["spec"])
    lm = TinyLM(TINY_MODELS[MODEL], weights_seed(spec.model.revision or "main"))
    ns = kubectl.create_namespace("cpu-multi-node")
    try:
        kubectl.apply(doc, namespace=ns)
        kubectl.apply(deployment(SINGLE), namespace=ns)
        for name in (SPLIT, SINGLE):
            ld = wait_for(f"{name} Ready", lambda n=name: kubectl.get("llmdeployment", n, ns),  # type: ignore[misc]
                          lambda d: is_true(d, "Ready"), timeout=READY_TIMEOUT)  # fmt: skip
            assert ((ld or {}).get("status") or {}).get("endpoints", {}).get("openai"), condition(ld, "Ready")
    except BaseException:
        print(what_the_pods_said(kubectl, ns))
        kubectl.delete("namespace", ns)
        raise
    yield World(ns, cluster.launcher, "".join(lm.generate(PROMPT, MAX_TOKENS)))
    kubectl.delete("namespace", ns)


def test_a_model_split_over_two_pods_answers_as_one_pod_does(world: World, kubectl: Kubectl) -> None:
    pods = world.members(kubectl, SPLIT)
    assert sorted(pods) == [f"{SPLIT}-0", f"{SPLIT}-g0-1"], sorted(pods)
    assert all(p["spec"]["nodeName"] == "real-0" for p in pods.values())
    # Rank 1 runs under the leader's mpirun, so its words reach the leader's log: each stage holds
    # half of tiny-llama's layers, rank 1 on the worker's host.
    log = kubectl("logs", f"{SPLIT}-0", namespace=world.namespace).stdout
    assert "pipeline stage 1 of 2: layers range(" in log, log[-3000:]
    single = world.answer(SINGLE)
    assert single == world.want
    assert world.answer(SPLIT) == single
    with base_url(world.cluster, f"http://{SPLIT}.{world.namespace}.svc:8080/v1") as served:
        openai_sdk.speaks_openai(served, "llm-operator/tiny-llama", MODEL)


def test_a_killed_worker_is_one_group_event(world: World, kubectl: Kubectl) -> None:
    """The worker's loss ends the leader's world; the leader's container restarts in place and
    relaunches every rank on the worker's replacement; the deployment says which member failed and
    why, and the group serves again: nothing meanwhile was answered by half a group."""
    worker = f"{SPLIT}-g0-1"
    fresh(world, kubectl, (f"{SPLIT}-0", worker))
    before, seen = generations(world, kubectl), group_events(kubectl, world.namespace, SPLIT)
    pods = uids(world, kubectl)
    # Until the world is new: the killed worker's processes end with its grace period (its preStop
    # drain waits on the leader), its replacement runs meanwhile, and the old world answers until then.
    kill = force_delete(kubectl, world.namespace, worker)
    group = recover_from(
        world, kubectl, SPLIT, kill, relaunched(world, kubectl, before), f"{worker} was killed"
    )
    assert group.wrong == [], group.wrong
    after, leader = uids(world, kubectl), f"{SPLIT}-0"
    # The worker's pod is new, the leader's the same (its container restarted in place).
    assert after[worker] != pods[worker] and after[leader] == pods[leader], (pods, after)
    assert len(signal_in(kubectl, world.namespace, worker, RANK, 0)) == 1, (
        "the new world's stage, and only it"
    )
    recreated = new_group_events(kubectl, world.namespace, SPLIT, seen)
    assert len(recreated) == 1, [(e.get("reason"), e.get("message")) for e in recreated]
    # The member seen failing first, in its container's words, then the group's pods.
    words = recreated[0]["message"]
    assert recreated[0]["type"] == "Warning" and re.match(rf"{SPLIT}-(0|g0-1) failed \(exited \d+", words), (
        words
    )
    assert words.endswith(f"restarts as a whole, its leader relaunching every rank ({SPLIT}-0, {worker})"), (
        words
    )
    # The worker named: its own failure, or the leader's, in mpirun's words read back by the launcher.
    assert re.search(rf"^{worker} failed|mpirun: [^;]* {worker}\.", words), words
    single = recover(world, kubectl, SINGLE, f"{SINGLE}-0")
    print(f"recovery from a killed pod: the 2-pod group {group.seconds:.1f} s, a single pod "
          f"{single.seconds:.1f} s; the group's Ready meanwhile: {group.not_ready}")  # fmt: skip


def group_fault(world: World, kubectl: Kubectl, fault: Callable[[], object], what: str,
                words: str) -> Recovery:  # fmt: skip
    """`fault`, from a group that never restarted, relaunches the whole world with no rank of the
    old one left; its GroupRecreated Event names a member and matches `words`; tiny-single answers
    every request meanwhile."""
    ns, worker = world.namespace, f"{SPLIT}-g0-1"
    fresh(world, kubectl, (f"{SPLIT}-0", worker))
    before, seen = generations(world, kubectl), group_events(kubectl, ns, SPLIT)
    try:
        with Other(lambda: world.answer(SINGLE, timeout=30), world.want) as single:
            group = recover_from(world, kubectl, SPLIT, fault, relaunched(world, kubectl, before), what)
    except BaseException:
        print(what_the_pods_said(kubectl, ns))
        raise
    assert group.wrong == [], group.wrong
    assert single.asked and single.failed == [], single.failed
    ranks = signal_in(kubectl, ns, worker, RANK, 0, check=False)
    recreated = new_group_events(kubectl, ns, SPLIT, seen)
    said = [e["message"] for e in recreated]
    if len(recreated) != 1 or len(ranks) != 1:
        tree = kubectl("exec", "-n", ns, worker, "-c", "triton", "--", "python3", "-c", TREE, check=False)
        print(tree.stdout, what_the_pods_said(kubectl, ns))
    assert len(ranks) == 1, f"the new world's stage, and only it: {ranks}"
    assert len(recreated) == 1 and recreated[0]["type"] == "Warning", "\n".join(said)
    assert re.match(rf"{SPLIT}-(0|g0-1) failed \(exited \d+", said[0]) and re.search(words, said[0]), said
    assert said[0].endswith(f"({SPLIT}-0, {worker})"), said
    print(f"recovery from {what}: the group {group.seconds:.1f} s; {SINGLE} answered {single.asked} requests "
          f"meanwhile; GroupRecreated: {said[0]}; Ready: {group.not_ready}")  # fmt: skip
    return group


def test_a_rank_that_exits_is_one_group_event(world: World, kubectl: Kubectl) -> None:
    """Rank 1 ends (SIGTERM): mpirun aborts the world, the leader fails naming the rank and its pod."""
    worker = f"{SPLIT}-g0-1"
    group_fault(world, kubectl, lambda: signal_in(kubectl, world.namespace, worker, RANK, signal.SIGTERM),
                "rank 1 exiting", rf"mpirun: rank 1 on {worker}\.\S+ exited on signal 15")  # fmt: skip


def test_a_killed_launch_agent_is_one_group_event(world: World, kubectl: Kubectl) -> None:
    """The worker's launch agent (what the next launch needs) ends: the worker fails, its ranks with
    it."""
    worker = f"{SPLIT}-g0-1"

    def kill() -> None:
        assert len(signal_in(kubectl, world.namespace, worker, AGENT, signal.SIGTERM)) == 1

    words = rf"the launch agent exited|mpirun: (rank 1 on|lost the connection to the MPI daemon on) {worker}"
    group_fault(world, kubectl, kill, "the worker's launch agent killed", words)


def test_a_frozen_rank_is_one_group_event(world: World, kubectl: Kubectl) -> None:
    """Rank 1 frozen (SIGSTOP): rank 0 waits on it, Triton stays live; the leader's front door finds
    no response for stallTimeoutSeconds with a request in flight and ends the leader. Beside it, a
    single pod's frozen tritonserver, which its liveness probe finds."""
    ns, worker = world.namespace, f"{SPLIT}-g0-1"
    old = (kubectl.get("pod", f"{SINGLE}-0", ns) or {})["status"]["containerStatuses"][0]["restartCount"]
    single: list[Recovery] = []

    def freeze_single() -> None:
        def restarted(_down: bool) -> bool:
            pod = kubectl.get("pod", f"{SINGLE}-0", ns) or {}
            return bool(pod_ready(pod) and pod["status"]["containerStatuses"][0]["restartCount"] > old)

        freeze = lambda: signal_in(kubectl, ns, f"{SINGLE}-0", TRITON, signal.SIGSTOP)  # noqa: E731
        single.append(recover_from(world, kubectl, SINGLE, freeze, restarted, "its tritonserver frozen"))

    def freeze() -> None:
        assert len(signal_in(kubectl, ns, worker, RANK, signal.SIGSTOP)) == 1
        beside.start()

    beside = threading.Thread(target=freeze_single, daemon=True)
    fresh(world, kubectl, (f"{SPLIT}-0", worker))
    before, seen = generations(world, kubectl), group_events(kubectl, world.namespace, SPLIT)
    group = recover_from(world, kubectl, SPLIT, freeze, relaunched(world, kubectl, before), "rank 1 frozen")
    beside.join(timeout=READY_TIMEOUT)
    assert group.wrong == [], group.wrong
    # The stopped stage ended with its world (SIGKILL reaches a stopped process): the new one alone.
    assert len(signal_in(kubectl, ns, worker, RANK, 0)) == 1
    said = [e["message"] for e in new_group_events(kubectl, world.namespace, SPLIT, seen)]
    assert len(said) == 1 and re.match(rf"{SPLIT}-0 failed \(exited 70 ", said[0]), said
    assert re.search(
        r"stalled: no response from Triton for 1\d s while 1 request\(s\) were in flight", said[0]
    )
    assert single and single[0].wrong == [], single
    print(f"recovery from a frozen rank: the group {group.seconds:.1f} s, a single pod's frozen server "
          f"{single[0].seconds:.1f} s; GroupRecreated: {said[0]}; Ready: {group.not_ready}")  # fmt: skip


def test_a_deleted_leader_is_relaunched_with_the_whole_world_on_its_worker(
    world: World, kubectl: Kubectl
) -> None:
    """The leader alone is recreated (a deletion is no failure: no GroupRecreated) and its mpirun
    starts every rank anew; the worker pod stays, its launch agent starting the new world, with no rank of
    the old one left beside the new one's."""
    ns, leader, worker = world.namespace, f"{SPLIT}-0", f"{SPLIT}-g0-1"
    before, seen = uids(world, kubectl), group_events(kubectl, world.namespace, SPLIT)
    with Other(lambda: world.answer(SINGLE, timeout=30), world.want) as single:
        group = recover(world, kubectl, SPLIT, leader)
    after, ranks = uids(world, kubectl), signal_in(kubectl, ns, worker, RANK, 0, check=False)
    tree = kubectl("exec", "-n", ns, worker, "-c", "triton", "--", "python3", "-c", TREE, check=False)
    said = (f"{before} -> {after}, ranks {ranks}:\n{tree.stdout}{tree.stderr}\n"
            f"{what_the_pods_said(kubectl, ns)}")  # fmt: skip
    assert group.wrong == [] and after[worker] == before[worker] and after[leader] != before[leader], said
    assert new_group_events(kubectl, world.namespace, SPLIT, seen) == [], said
    assert len(ranks) == 1, said  # the new world's stage, and only it
    assert single.asked and single.failed == [], single.failed
    print(f"recovery from a deleted leader: the group {group.seconds:.1f} s (the leader's pod new, the "
          f"worker's kept); {SINGLE} answered {single.asked} requests meanwhile; "
          f"Ready: {group.not_ready}")  # fmt: skip


def test_the_hpa_scales_the_split_deployment_by_whole_groups(world: World, kubectl: Kubectl) -> None:
    """An HPA on the leaders' pending requests (minReplicas 2) adds a whole second group, both
    groups answer the reference text from their own leaders, the HPA reads its metric from the
    leaders only; maxReplicas 1 then takes the second group away whole, its requests drained, the
    first group untouched and answering throughout."""
    ns, start, half = world.namespace, time.monotonic(), HalfGroups()
    first, seen = uids(world, kubectl), group_events(kubectl, world.namespace, SPLIT)

    def sample() -> dict[str, dict[str, Any]]:
        # The status before the pods: going up, pods read after it are at least as Ready as it counted.
        ld = kubectl.get("llmdeployment", SPLIT, ns) or {}
        pods = world.members(kubectl, SPLIT)
        half.sample((ld.get("status") or {}).get("readyReplicas", 0), pods, SPLIT, 2)
        return pods

    try:
        scale_up_and_down(world, kubectl, sample, half, first, seen, start)
    finally:  # replicas 1, no HPA: as the module began
        kubectl.apply(split_deployment(), namespace=ns)
    wait_for("the HPA removed", lambda: kubectl.get("hpa", SPLIT, ns), lambda h: h is None, timeout=60)


def scale_up_and_down(world: World, kubectl: Kubectl, sample: Callable[[], dict[str, dict[str, Any]]],
                      half: HalfGroups, first: dict[str, str], seen: set[tuple[str, int]],
                      start: float) -> None:  # fmt: skip
    ns = world.namespace
    kubectl.apply(autoscaled(split_deployment(), 2, 2), namespace=ns)
    pods = wait_for("two whole groups Ready", sample,
                    lambda p: [len(m) for m in groups(p, SPLIT).values()] == [2, 2]
                    and all(pod_ready(x) for x in p.values()), timeout=READY_TIMEOUT)  # fmt: skip
    up = time.monotonic() - start
    assert sorted(pods) == [f"{SPLIT}-0", f"{SPLIT}-1", f"{SPLIT}-g0-1", f"{SPLIT}-g1-1"], sorted(pods)
    wait_for(f"{SPLIT} 2 replicas Ready", lambda: kubectl.get("llmdeployment", SPLIT, ns) or {},
             lambda d: (d.get("status") or {}).get("readyReplicas") == 2, timeout=60)  # fmt: skip
    assert all(world.answer_at(pods[f"{SPLIT}-{i}"]) == world.want for i in (0, 1))
    selector = scale_selector(kubectl, ns, SPLIT)
    assert "llmoperator.io/role=leader" in selector, selector
    metric = wait_for("the HPA reading its metric", lambda: hpa_metric(kubectl, ns, SPLIT), timeout=90)
    read = time.monotonic() - start
    # The leaders, no worker, once Prometheus has scraped the new one and the adapter listed it.
    leaders = [f"{SPLIT}-0", f"{SPLIT}-1"]
    wait_for("both leaders in the custom metrics API", lambda: custom_metric(kubectl, ns, SPLIT),
             lambda v: sorted(v) == leaders, timeout=60)  # fmt: skip
    down = time.monotonic()
    # Going down, the status counts a leaving group until the reconcile after its pods changed:
    # sampled going up only, where a group must never count before it is whole.
    with Other(lambda: world.answer(SPLIT, timeout=30), world.want) as split:
        kubectl.apply(autoscaled(split_deployment(), 1, 1), namespace=ns)
        wait_for("the second group gone, pods and worker StatefulSet", lambda: world.members(kubectl, SPLIT),
                 lambda p: p.keys() == first.keys() and not kubectl.get("statefulset", f"{SPLIT}-g1", ns),
                 timeout=READY_TIMEOUT)  # fmt: skip
        gone = time.monotonic() - down
        time.sleep(2)  # a request or two more from the one group left
    assert uids(world, kubectl) == first, "the first group untouched"
    assert split.asked and split.failed == [], split.failed
    assert half.seen == [], half.seen
    # A group taken away on purpose is no group failure.
    broken = [e["message"] for e in new_group_events(kubectl, ns, SPLIT, seen)]
    assert broken == [], broken
    print(f"HPA on {SPLIT}: 2 whole groups Ready {up:.1f} s after minReplicas 2, its metric read "
          f"({metric}) at {read:.1f} s; back to 1 group in {gone:.1f} s, {split.asked} requests "
          f"meanwhile, 0 failed")  # fmt: skip


def test_a_bad_canary_of_the_split_deployment_is_aborted_and_rolled_back(
    world: World, kubectl: Kubectl, prometheus: str
) -> None:
    """A canary revision of the split deployment runs as a whole group of its own beside the
    stable one, takes half the requests through its leader (replica-ratio), fails its analysis on
    its leader's error rate (the fault knob), is aborted with its whole group removed, and the
    stable spec applied again rolls it back; the stable group serves throughout, untouched."""
    ns, start = world.namespace, time.monotonic()
    v1 = with_canary(split_deployment(), prometheus)
    kubectl.apply(v1, namespace=ns)
    one = [f"{SPLIT}-0", f"{SPLIT}-g0-1"]
    wait_for("one group", lambda: world.members(kubectl, SPLIT), lambda p: sorted(p) == one, timeout=120)
    stable, seen = uids(world, kubectl), group_events(kubectl, world.namespace, SPLIT)
    service = (kubectl.get("service", SPLIT, ns) or {})["spec"]["clusterIP"]
    traffic = Load(world.cluster.netns, service, OPENAI_PORT, concurrency=2, max_requests=5_000,
                   max_seconds=READY_TIMEOUT, openai_model=MODEL, pace_seconds=0.25)  # fmt: skip
    with Recorder(kubectl, ns, SPLIT) as rec, traffic:
        kubectl.apply(with_env(v1, LLMOP_FAULT_ERROR_PERCENT="50"), namespace=ns)
        took = wait_for("the canary's group Ready", lambda: rollout(kubectl, ns),
                        lambda r: bool(r.get("canaryReadyReplicas")), timeout=READY_TIMEOUT)  # fmt: skip
        canary = {n: p for n, p in world.members(kubectl, SPLIT).items() if n.startswith(f"{SPLIT}-b-")}
        assert sorted(canary) == [f"{SPLIT}-b-0", f"{SPLIT}-b-g0-1"], sorted(canary)
        assert all(pod_ready(p) for p in canary.values()), "the canary counted Ready only as a whole group"
        aborted = wait_for("the canary aborted", lambda: rollout(kubectl, ns),
                           lambda r: r.get("phase") == "Aborted", timeout=120)  # fmt: skip
        wait_for("the canary's whole group gone", lambda: world.members(kubectl, SPLIT),
                 lambda p: sorted(p) == sorted(stable), timeout=120)  # fmt: skip
        stats = traffic.stop()
    assert stats.injected > 0 and stats.not_injected == 0, stats.errors
    assert took["canarySlot"] == "b" and "error rate" in aborted["abortReason"], aborted
    assert uids(world, kubectl) == stable, "the stable group untouched"
    # The canary's leader may end Failed as its group is removed (its worker ended the world first):
    # a member asked to end is no failure (docs/launcher-and-engines.md).
    broken = [e["message"] for e in new_group_events(kubectl, ns, SPLIT, seen)]
    assert broken == [], broken
    # Only its leader was ever behind the Service (or the knob's errors would not show).
    assert rec.first(lambda s: (s.revisions.get("canaryWeight") or 0) > 0)
    kubectl.apply(v1, namespace=ns)  # the stable spec: rolled back
    back = wait_for("rolled back", lambda: rollout(kubectl, ns),
                    lambda r: "canary" not in r and r.get("phase") == "Stable", timeout=60)  # fmt: skip
    wait_for(f"{SPLIT} Ready", lambda: kubectl.get("llmdeployment", SPLIT, ns), lambda d: is_true(d, "Ready"),
             timeout=60)  # fmt: skip
    assert back["stable"] == aborted["stable"] and world.answer(SPLIT) == world.want
    print(f"bad canary of {SPLIT}: its group Ready, aborted and removed, rolled back in {since(start)}; "
          f"{stats.ok} requests served, {stats.injected} failed by the knob, 0 otherwise")  # fmt: skip


def rollout(kubectl: Kubectl, namespace: str) -> dict[str, Any]:
    return revisions(kubectl.get("llmdeployment", SPLIT, namespace))
