"""The world of the multi-node group e2e (tests/e2e/test_cpu_multi_node.py, test_lws_multi_node.py)
and of P14 (bench/groups.py):
tiny-llama split over two CPU pods (`tiny-pp`) beside one pod of the same weights (`tiny-single`),
the reference text decoded in this process, and how a fault's recovery is timed: from the fault to
the first right answer, every answer meanwhile checked against the reference text."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import yaml

from e2e.chat import at_pod, base_url
from e2e.cluster.launcher import Cluster
from e2e.cluster.testing import Kubectl, condition, pod_ready, wait_for
from e2e.group_faults import what_the_pods_said

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "cpu-reference-llmapi.yaml"
SPLIT, SINGLE = "tiny-pp", "tiny-single"
CPU_LIMIT = "250m"
PROMPT, MAX_TOKENS = "Once upon a time", 24
MODEL = "tiny-llama"
READY_TIMEOUT = 300
# The group's stallTimeoutSeconds: a token of tiny-llama on these pods comes within a second.
STALL_TIMEOUT = 15


def deployment(name: str, **spec: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["resources"]["cpu"] = CPU_LIMIT
    doc["spec"].update(spec)
    return doc


def split_deployment() -> dict[str, Any]:
    doc = deployment(SPLIT, parallelism={"tensor": 1, "pipeline": 2})
    doc["spec"]["runtime"]["stallTimeoutSeconds"] = STALL_TIMEOUT
    return doc


@dataclass
class World:
    namespace: str
    cluster: Cluster  # the embedded one: its network namespace reaches Services and pods
    want: str  # the reference text: the same weights decoded in this process

    def members(self, kubectl: Kubectl, name: str) -> dict[str, dict[str, Any]]:
        pods = kubectl.items("pods", self.namespace, f"llmoperator.io/deployment={name}")
        return {p["metadata"]["name"]: p for p in pods}

    def answer(self, name: str, timeout: float = 60) -> str:
        url = f"http://{name}.{self.namespace}.svc:8080/v1"
        with base_url(self.cluster, url) as served:
            return ask(served, timeout)

    def answer_at(self, pod: dict[str, Any], timeout: float = 60) -> str:
        """The answer of one leader pod's own front door."""
        with at_pod(self.cluster, pod) as served:
            return ask(served, timeout)


def ask(served: str, timeout: float) -> str:
    client = openai.OpenAI(base_url=served, api_key="unused", max_retries=0, timeout=timeout)
    done = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
    return done.choices[0].text


@dataclass
class Recovery:
    seconds: float  # from the fault to the first right answer
    wrong: list[str]  # answers served meanwhile that were not the reference text
    not_ready: list[str]  # the Ready condition's messages meanwhile


def recover(world: World, kubectl: Kubectl, name: str, pod: str, timeout: float = READY_TIMEOUT) -> Recovery:
    """Kill `pod` (its API object deleted with no grace, as a node's loss ends it) and ask the
    deployment until it answers the reference text again, from a group that lost a request or from
    a Ready replacement of `pod`. Both, because the API object goes at once and its processes
    later: a kubelet ends a force-deleted pod with the grace period of its spec (the preStop drain
    runs), so a single pod may keep answering until its replacement is Ready and no request fails;
    a group's leader stops with its worker."""
    old = (kubectl.get("pod", pod, world.namespace) or {})["metadata"]["uid"]

    def back(down: bool) -> bool:
        return down or replaced(kubectl, world.namespace, pod, old)

    return recover_from(world, kubectl, name, force_delete(kubectl, world.namespace, pod), back,
                        f"{pod} was killed", timeout)  # fmt: skip


def force_delete(kubectl: Kubectl, namespace: str, pod: str) -> Callable[[], object]:
    return lambda: kubectl("delete", "pod", pod, "--grace-period=0", "--force", "--wait=false",
                           namespace=namespace)  # fmt: skip


def recover_from(world: World, kubectl: Kubectl, name: str, fault: Callable[[], object],
                 back: Callable[[bool], bool], what: str,
                 timeout: float = READY_TIMEOUT) -> Recovery:  # fmt: skip
    """Cause `fault`, then ask `name` until it answers the reference text once `back(down)` holds
    (down: a request failed since the fault)."""
    fault()
    start, wrong, not_ready, down = time.monotonic(), list[str](), list[str](), False
    while time.monotonic() - start < timeout:
        ready = condition(kubectl.get("llmdeployment", name, world.namespace), "Ready") or {}
        said = f"{ready.get('reason')}: {ready.get('message')}"
        if ready.get("status") != "True" and said not in not_ready:
            not_ready.append(said)
        try:
            text = world.answer(name, timeout=STALL_TIMEOUT + 10)
        except (openai.APIError, OSError):  # refused, reset, timed out: not serving
            down = True
            time.sleep(1)
            continue
        if text != world.want:
            wrong.append(text)
        elif back(down):
            return Recovery(time.monotonic() - start, wrong, not_ready)
        time.sleep(0.5)
    said = what_the_pods_said(kubectl, world.namespace)
    raise AssertionError(f"{name} not serving again {timeout:.0f} s after {what} (down: {down}):\n{said}")


def replaced(kubectl: Kubectl, namespace: str, pod: str, uid: str) -> bool:
    now = kubectl.get("pod", pod, namespace)
    return now is not None and now["metadata"]["uid"] != uid and pod_ready(now)


def uids(world: World, kubectl: Kubectl) -> dict[str, str]:
    return {n: p["metadata"]["uid"] for n, p in world.members(kubectl, SPLIT).items()}


def all_new(world: World, kubectl: Kubectl, before: dict[str, str]) -> Callable[[bool], bool]:
    """Every member of the group is a new pod (by UID) under its old name."""

    def check(_down: bool) -> bool:
        now = uids(world, kubectl)
        return sorted(now) == sorted(before) and not set(now.values()) & set(before.values())

    return check


def generation(pod: dict[str, Any] | None) -> tuple[str, int] | None:
    """Which run of its container a pod is in: its UID and its container's restarts."""
    if pod is None:
        return None
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return pod["metadata"]["uid"], int(statuses[0].get("restartCount", 0))


def generations(world: World, kubectl: Kubectl) -> dict[str, tuple[str, int] | None]:
    return {n: generation(p) for n, p in world.members(kubectl, SPLIT).items()}


def relaunched(
    world: World, kubectl: Kubectl, before: dict[str, tuple[str, int] | None]
) -> Callable[[bool], bool]:
    """The group's world is new and Ready: its leader, which launches every rank, is a new pod or
    its container restarted in place (docs/architecture.md, "A broken group restarts its world in
    place")."""
    leader = f"{SPLIT}-0"

    def check(_down: bool) -> bool:
        pod = kubectl.get("pod", leader, world.namespace)
        return generation(pod) not in (None, before[leader]) and pod_ready(pod)

    return check


def fresh(world: World, kubectl: Kubectl, pods: tuple[str, ...]) -> None:
    """Every pod of `pods` Ready and answering, none restarted: those that did are deleted and
    made anew, so the kubelet's restart back-off from an earlier fault never lengthens a later one."""
    ns = world.namespace
    restarted = [p for p in pods if (generation(kubectl.get("pod", p, ns)) or ("", 1))[1] > 0]
    if restarted:
        kubectl("delete", "pod", *restarted, "--grace-period=1", "--wait=true", namespace=ns)
    wait_for(f"{', '.join(pods)} Ready", lambda: [kubectl.get("pod", p, ns) for p in pods],
             lambda got: all(pod_ready(p) for p in got), timeout=READY_TIMEOUT)  # fmt: skip

    def answers() -> bool:
        try:
            return world.answer_at(kubectl.get("pod", pods[0], ns) or {}, timeout=10) == world.want
        except (openai.APIError, OSError, KeyError):
            return False

    wait_for(f"{pods[0]} answering", answers, timeout=READY_TIMEOUT)
