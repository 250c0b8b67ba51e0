"""High availability on the real control plane: the chart's two operator pods elect one leader
with a Lease, only the leader writes, and the other takes over when the leader is deleted
(gracefully, forced, or dead without releasing); a leader paused past its lease resumes without
writing anything and exits.

Evidence comes from each operator's own metrics and log, never from the children alone: the
session's host operator (tests/e2e/operator_fixtures.py), when another test started it, applies
the same children too. The chart's operator watches only the test's namespace.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster.testing import E2ECluster, Kubectl, pod_ready, wait_for
from tests.e2e import manifests
from tests.e2e import test_chart_install as chart
from tests.e2e.operator_fixtures import OperatorProcess, sample
from tests.e2e.test_chart_install import TIMEOUT, Helm
from tests.unit.test_chart import CHART

pytestmark = [pytest.mark.e2e, pytest.mark.exclusive]  # the chart's operator replicas watch every namespace
release = chart.release  # the fixture: a unique release name, uninstalled afterwards

REPO = Path(__file__).resolve().parents[2]
GPU = {"gpu": {"products": ["NVIDIA-H100-80GB-HBM3"]}}  # serving pods on KWOK nodes: no CPU used


def lease_holder(kubectl: Kubectl, namespace: str, name: str) -> str | None:
    lease = kubectl.get("lease", name, namespace)
    return lease["spec"].get("holderIdentity") if lease is not None else None


def pod_metrics(kubectl: Kubectl, namespace: str, pod: str) -> str:
    """The pod's :8000/metrics through the API server's proxy (inside the cluster's network)."""
    result = kubectl(
        "get", "--raw", f"/api/v1/namespaces/{namespace}/pods/{pod}:8000/proxy/metrics", check=False
    )
    return result.stdout if result.returncode == 0 else ""


def operator_pid(pod: str) -> int:
    """The host pid of the operator process running in `pod` (its identity is in its environment)."""
    needle = f"LLMOP_LEADER_ELECTION_IDENTITY={pod}\0".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "environ").read_bytes():
                    return int(entry.name)
            except OSError:
                continue
    raise AssertionError(f"no process of pod {pod} found")


def operator_pods(kubectl: Kubectl, namespace: str, release_name: str) -> list[dict[str, Any]]:
    pods = kubectl.items("pods", namespace, f"app.kubernetes.io/instance={release_name}")
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def test_chart_replicas_elect_one_leader_and_fail_over(
    release: tuple[Helm, str], kubectl: Kubectl, namespace: str, gpu_pools: None
) -> None:
    helm, name = release
    lease = f"{name}-llm-operator"
    helm("install", name, str(CHART), "--namespace", namespace, "--set", f"watchNamespaces={{{namespace}}}",
         *helm.images, "--wait", f"--timeout={TIMEOUT}s")  # fmt: skip
    pods = operator_pods(kubectl, namespace, name)
    assert len(pods) == 2 and all(pod_ready(p) for p in pods), "both replicas Ready: the standby too"
    names = {p["metadata"]["name"] for p in pods}
    leader = str(
        wait_for("a Lease holder", lambda: lease_holder(kubectl, namespace, lease), lambda h: h in names)
    )
    print(kubectl("get", "lease", lease, namespace=namespace).stdout)

    manifests.engines_claim(kubectl, namespace)
    kubectl.apply(manifests.deployment("ha", resources=GPU), namespace=namespace)
    wait_for("the leader's StatefulSet apply", lambda: pod_metrics(kubectl, namespace, leader),
             lambda t: sample(t, "llm_operator_api_writes_total", kind="StatefulSet", verb="apply") >= 1,
             timeout=TIMEOUT)  # fmt: skip
    (standby,) = names - {leader}
    text = pod_metrics(kubectl, namespace, standby)
    assert sample(text, "llm_operator_leader") == 0 and "llm_operator_leader 0.0" in text
    assert sample(text, "llm_operator_api_writes_total") == 0, "the standby writes nothing"
    assert sample(pod_metrics(kubectl, namespace, leader), "llm_operator_leader") == 1

    # how -> (the Lease's acquireTime, the edit seen applied by the new leader), seconds after the kill
    figures: dict[str, tuple[float, float]] = {}
    replicas = 1
    for how in ("graceful delete", "forced delete", "crash: stopped, then forced delete"):
        leader = lease_holder(kubectl, namespace, lease) or ""
        started, wall = time.monotonic(), datetime.now(UTC)
        if how.startswith("crash"):  # dies without its SIGTERM handler ever running: no release
            os.kill(operator_pid(leader), signal.SIGSTOP)
        grace = [] if how == "graceful delete" else ["--grace-period=0", "--force"]
        kubectl("delete", "pod", leader, "--wait=false", *grace, namespace=namespace)

        def moved(holder: str | None, old: str = leader) -> bool:
            return holder not in (None, "", old)

        successor = str(
            wait_for(f"another replica to hold the Lease after a {how}",
                     lambda: lease_holder(kubectl, namespace, lease), moved, timeout=60, interval=0.2)
        )  # fmt: skip
        # Edited only now: until it has released the Lease, the old leader still leads and rightly
        # applies an edit itself (a slow SIGTERM), and its successor then has nothing to write.
        replicas += 1
        kubectl("patch", "llmdeployment", "ha", "--type=merge", "-p", f'{{"spec":{{"replicas":{replicas}}}}}',
                namespace=namespace)  # fmt: skip

        def reconciled(successor: str = successor) -> dict[str, Any]:
            text = pod_metrics(kubectl, namespace, successor)
            sts = kubectl.get("statefulset", "ha", namespace)
            applies = sample(text, "llm_operator_api_writes_total", kind="StatefulSet", verb="apply")
            replicas = sts["spec"]["replicas"] if sts is not None else None
            return {"leader": sample(text, "llm_operator_leader"), "applies": applies, "replicas": replicas}

        def applied_by_it(seen: dict[str, Any], edited: int = replicas) -> bool:
            return bool(seen["leader"] == 1 and seen["applies"] >= 1 and seen["replicas"] == edited)

        wait_for(f"{successor} to apply the edit after a {how}", reconciled, applied_by_it,
                 timeout=60, interval=0.2)  # fmt: skip
        applied = time.monotonic() - started
        acquired = kubectl.json("get", "lease", lease, namespace=namespace)["spec"]["acquireTime"]
        figures[how] = ((datetime.fromisoformat(acquired) - wall).total_seconds(), applied)
        # The Deployment replaces the deleted pod: a standby again before the next round.
        wait_for("two Ready operator pods", lambda: operator_pods(kubectl, namespace, name),
                 lambda ps: len(ps) == 2 and all(pod_ready(p) for p in ps), timeout=TIMEOUT)  # fmt: skip
    lease_obj = kubectl.get("lease", lease, namespace)
    assert lease_obj is not None and lease_obj["spec"]["leaseTransitions"] >= 3
    for how, (held, applied) in figures.items():
        print(f"failover, {how}: the other replica held the Lease after {held:.1f} s and had applied the "
              f"spec edit after {applied:.1f} s")  # fmt: skip
    # A graceful stop releases the Lease; a leader that never ran its SIGTERM handler is waited out
    # for the lease duration (15 s) since the standby last saw it renewed (at most 2 s earlier).
    assert figures["graceful delete"][0] < 13
    assert figures["crash: stopped, then forced delete"][0] >= 13, "nobody may take an unexpired Lease"


# --- a paused leader ---------------------------------------------------------------------------------


def host_operator(cluster: E2ECluster, namespace: str, identity: str, log_dir: Path) -> OperatorProcess:
    """`llm-operator run --namespace NS` with leader election, short timings and request logging."""
    return OperatorProcess(
        cluster,
        log_dir / f"{identity}.log",
        ("--namespace", namespace),
        LLMOP_LOG_LEVEL="DEBUG",  # every API request is logged: the evidence of no writes
        LLMOP_LEADER_ELECTION="true",
        LLMOP_LEADER_ELECTION_NAMESPACE=namespace,
        LLMOP_LEADER_ELECTION_LEASE="llm-operator",
        LLMOP_LEADER_ELECTION_IDENTITY=identity,
        LLMOP_LEASE_DURATION_SECONDS="6",
        LLMOP_RENEW_DEADLINE_SECONDS="4",
        LLMOP_RETRY_PERIOD_SECONDS="1",
    )


# httpcore logs this line (at DEBUG) just before a request leaves; httpx's own line comes after the
# response, so a write sent before a pause would be logged after it.
WRITE_SENT = re.compile(r"send_request_headers\.started request=<Request \[b'(POST|PUT|PATCH|DELETE)'\]>")


def quiet(op: OperatorProcess, seconds: float = 2.0) -> None:
    """Wait until `op` has sent no write but its Lease renewals (its only PUTs) for `seconds`:
    nothing of its reconcile is in flight."""
    count = -1
    while (now := len([w for w in WRITE_SENT.findall(op.log()) if w != "PUT"])) != count:
        count = now
        time.sleep(seconds)


@pytest.fixture
def host_operators(
    crd: None, cluster: E2ECluster, namespace: str, tmp_path: Path
) -> Iterator[tuple[OperatorProcess, OperatorProcess]]:
    started: list[OperatorProcess] = []
    try:
        for identity in ("host-a", "host-b"):  # host-a first: it leads, host-b stands by
            started.append(host_operator(cluster, namespace, identity, tmp_path))
            started[-1].wait_healthy()
        yield started[0], started[1]
    finally:
        for op in started:
            op.stop()


def test_a_leader_paused_past_its_lease_resumes_without_writing(
    host_operators: tuple[OperatorProcess, OperatorProcess], kubectl: Kubectl, namespace: str, gpu_pools: None
) -> None:
    a, b = host_operators
    assert lease_holder(kubectl, namespace, "llm-operator") == "host-a", "the first one up leads"
    manifests.engines_claim(kubectl, namespace)
    kubectl.apply(manifests.deployment("ha", resources=GPU), namespace=namespace)
    wait_for("host-a applies the StatefulSet", lambda: a.log(),
             lambda t: "PATCH" in t and "/statefulsets/ha?" in t, timeout=TIMEOUT)  # fmt: skip
    assert WRITE_SENT.search(a.log()), "the leader's writes show in its log"
    assert not WRITE_SENT.search(b.log()), "the standby sent no write, not even to the Lease"

    quiet(a)
    a.proc.send_signal(signal.SIGSTOP)
    paused = time.monotonic()
    wait_for("host-b holds the Lease", lambda: lease_holder(kubectl, namespace, "llm-operator"),
             lambda h: h == "host-b", timeout=30, interval=0.2)  # fmt: skip
    takeover = time.monotonic() - paused
    # While host-a is still stopped: an edit that host-a's stale state would want to apply.
    kubectl(
        "patch", "llmdeployment", "ha", "--type=merge", "-p", '{"spec":{"replicas":2}}', namespace=namespace
    )
    wait_for("host-b applies the edit", lambda: kubectl.get("statefulset", "ha", namespace),
             lambda s: s is not None and s["spec"]["replicas"] == 2, timeout=TIMEOUT)  # fmt: skip
    assert re.search(r"PATCH \S+/statefulsets/ha\?", b.log()), "host-b reconciles"

    before = len(a.log().encode())
    a.proc.send_signal(signal.SIGCONT)
    resumed = time.monotonic()
    code = a.proc.wait(timeout=30)
    exited = time.monotonic() - resumed
    after = a.log(before)
    assert code == 1, f"host-a should exit 1 once it finds the Lease lost:\n{after[-3000:]}"
    assert "lost Lease" in after, after[-3000:]
    writes = WRITE_SENT.findall(after)
    assert not writes, f"host-a wrote after it resumed: {writes}"
    refused = after.count("this replica no longer holds the leader Lease")
    assert lease_holder(kubectl, namespace, "llm-operator") == "host-b" and b.healthy()
    print(
        f"paused leader: host-b took over {takeover:.1f} s after host-a stopped (lease 6 s); host-a resumed, "
        f"sent 0 writes ({refused} refused by its fence) and exited 1 after {exited:.1f} s"
    )
