"""P5, the autoscaling chain's reaction time on the embedded cluster's real node: from a load step on
a cpu-reference LLMDeployment (autoscaled on pending requests) to the HPA asking for more replicas
(writing the scale subresource) and to the new replica Ready, next to the chain's floor:

    floor = scrape interval + rate window / 2 + adapter relist + HPA sync period

(e2e/cluster/monitoring.py and the controller manager's flags; goal: within floor + 2 HPA syncs).
"To the new replica" is split where the chain ends: the new pod created (the goal applies), then
the pod's own start (container, Triton loading the model), printed beside it.
The same run as tests/e2e/test_autoscaling.py (e2e/cluster/scaling.py), with its own operator.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import yaml

from bench.world import REPO, operator_in
from e2e.cluster import monitoring, scaling
from e2e.cluster.testing import condition, is_true, wait_for

NAMESPACE = "bench-autoscaling"
NAME = "tiny-llama"
HPA_SYNC_S = 2  # e2e/cluster/flags.py: --horizontal-pod-autoscaler-sync-period
FLOOR_S = (
    monitoring.SCRAPE_INTERVAL_S + monitoring.RATE_WINDOW_S / 2 + monitoring.ADAPTER_RELIST_S + HPA_SYNC_S
)


def _deployment() -> dict[str, object]:
    doc = yaml.safe_load((REPO / "examples" / "cpu-reference.yaml").read_text())
    doc["spec"]["resources"]["cpu"] = "250m"  # three replicas fit on the real node's 2 CPUs
    return scaling.autoscaled(doc)


def run(print_fn: Callable[[str], None] = print) -> None:
    with operator_in(NAMESPACE, (18910, 18911), print_fn) as (cluster, kubectl):
        kubectl.apply(_deployment(), namespace=NAMESPACE)
        wait_for(
            "the LLMDeployment Ready",
            lambda: kubectl.get("llmdeployment", NAME, NAMESPACE),
            lambda o: is_true(o, "Ready"),
            timeout=300,
        )
        wait_for(
            "the HPA reading its metric",
            lambda: kubectl.get("hpa", NAME, NAMESPACE),
            lambda h: (condition(h, "ScalingActive") or {}).get("status") == "True",
            timeout=120,
        )
        time.sleep(2 * monitoring.RATE_WINDOW_S)  # a settled, idle baseline before the step
        t = scaling.run(kubectl, cluster.netns, cluster.prometheus_url, NAMESPACE, NAME, log=lambda _: None)
        goal = FLOOR_S + 2 * HPA_SYNC_S
        print_fn(
            f"autoscaling bench (P5): floor = scrape {monitoring.SCRAPE_INTERVAL_S} s + window/2 "
            f"{monitoring.RATE_WINDOW_S / 2:g} s + adapter relist {monitoring.ADAPTER_RELIST_S} s + HPA sync "
            f"{HPA_SYNC_S} s = {FLOOR_S:g} s (goal <= floor + 2 syncs = {goal:g} s)"
        )
        print_fn(
            f"autoscaling bench (P5): load step -> HPA asks for {t.replicas_asked} replicas: "
            f"{t.scale_asked_s:.1f} s, ratio to floor {t.scale_asked_s / FLOOR_S:.2f}"
        )
        created = t.new_created_s
        print_fn(
            f"autoscaling bench (P5): load step -> new serving pod created: {created:.1f} s "
            f"(HPA ask -> pod: {created - t.scale_asked_s:.1f} s of operator and StatefulSet controller), "
            f"ratio to floor {created / FLOOR_S:.2f}, {'within' if created <= goal else 'OVER'} the goal"
        )
        print_fn(
            f"autoscaling bench (P5): new pod created -> Ready: {t.new_ready_s - created:.1f} s (container "
            f"start and Triton loading the model on the loaded node: the pod's own, not the chain's); "
            f"load step -> new replica Ready {t.new_ready_s:.1f} s"
        )
        print_fn(
            f"autoscaling bench (P5): back to 1 replica {t.scaled_down_s - t.load_dropped_s:.1f} s after the "
            f"load dropped; requests ok {t.stats.ok}, failed {t.stats.failed}"
        )


if __name__ == "__main__":
    run()
