"""P6, a bad canary's blast radius on the embedded cluster's real node: a cpu-reference
LLMDeployment under bounded traffic gets a new revision that fails half its requests (the CPU
runtime's TEST-ONLY fault knob); the bench times how long the canary holds traffic, counted from
the moment it first takes some (the start of its first bad window), in analysis intervals, and
counts the requests that failed for any other reason (those the stable revision would be blamed
for). Goal: <= 2 intervals, 0 failed on stable.

The same run as tests/e2e/test_canary.py's bad canary (e2e/cluster/canary.py), with its own
operator.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from llm_operator.contract import OPENAI_PORT

from bench.world import operator_in
from e2e.cluster import canary
from e2e.cluster.load import Load
from e2e.cluster.testing import is_true, wait_for

NAMESPACE = "bench-canary"
GOAL_INTERVALS = 2


def run(print_fn: Callable[[str], None] = print) -> None:
    with operator_in(NAMESPACE, (18920, 18921), print_fn) as (cluster, kubectl):
        stable = canary.deployment(cluster.prometheus_url)
        kubectl.apply(stable, namespace=NAMESPACE)
        wait_for(
            "the stable revision Ready",
            lambda: kubectl.get("llmdeployment", canary.NAME, NAMESPACE),
            lambda o: is_true(o, "Ready"),
            timeout=300,
        )
        service = kubectl.get("service", canary.NAME, NAMESPACE)
        assert service is not None
        ip = service["spec"]["clusterIP"]
        traffic = Load(cluster.netns, ip, OPENAI_PORT, concurrency=2, max_requests=20_000, max_seconds=400,
                       openai_model="tiny-llama")  # fmt: skip
        with canary.Recorder(kubectl, NAMESPACE) as rec, traffic:
            kubectl.apply(canary.with_env(stable, LLMOP_FAULT_ERROR_PERCENT="50"), namespace=NAMESPACE)
            wait_for(
                "the bad canary withdrawn",
                lambda: canary.revisions(kubectl.get("llmdeployment", canary.NAME, NAMESPACE)),
                lambda r: r.get("phase") == "Aborted" and r.get("canaryReadyReplicas") == 0,
                timeout=400,
            )
            time.sleep(canary.INTERVAL_S)  # traffic goes on: the stable revision alone serves it
            stats = traffic.stop()
        took = rec.first(lambda s: (s.revisions.get("canaryReadyReplicas") or 0) >= 1)
        gone = rec.first(
            lambda s: s.revisions.get("phase") == "Aborted" and s.revisions.get("canaryReadyReplicas") == 0
        )
        assert took is not None and gone is not None
        held = gone.t - took.t
        intervals = held / canary.INTERVAL_S
        reason = canary.revisions(kubectl.get("llmdeployment", canary.NAME, NAMESPACE)).get("abortReason")
        verdict = "within" if intervals <= GOAL_INTERVALS else "OVER"
        print_fn(
            f"canary bench (P6): bad canary's first traffic -> no traffic: {held:.1f} s = {intervals:.2f} "
            f"analysis intervals of {canary.INTERVAL_S} s ({verdict} the goal of {GOAL_INTERVALS})"
        )
        print_fn(
            f"canary bench (P6): requests ok {stats.ok}, failed by the fault knob {stats.injected}, "
            f"failed otherwise (stable's) {stats.not_injected} (goal 0); abort reason: {reason}"
        )


if __name__ == "__main__":
    run()
