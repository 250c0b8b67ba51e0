"""The pure parts of bench P15/P16 (bench/zero.py) and of the scale-to-zero world they read
(e2e/zero_world.py): percentiles, the dispatch order, the overhead, a pod's phases from its object,
the phases a poll records, the first token of a stream, and that both deployments pass admission."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path
from typing import Any

import pytest
from llm_operator.api.v1alpha1 import LLMDeploymentSpec

from bench.zero import SINGLE, SPLIT, Order, deployments, dispatch_order, overhead, percentile
from e2e.cluster.testing import Kubectl
from e2e.zero_world import Phases, Streamed, pod_phases


def test_percentile_is_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values[::-1], 100) == 100.0
    assert percentile([3.0, 1.0, 2.0], 0) == 1.0
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))


def test_dispatch_order_counts_pairs_against_the_sending_order() -> None:
    sent = [0.0, 0.1, 0.2, 0.3]
    assert dispatch_order(sent, [1.0, 2.0, 3.0, 4.0]) == Order(pairs=6, in_order=6, most_overtaken=0)
    # The last one sent came first: it overtook all three; the first was overtaken by one.
    assert dispatch_order(sent, [2.0, 3.0, 4.0, 1.0]) == Order(pairs=6, in_order=3, most_overtaken=1)
    # First tokens within the tie (one batch) are no pair: neither in nor out of order.
    assert dispatch_order(sent, [1.0, 1.01, 1.02, 2.0], tie_s=0.05) == Order(3, 3, 0)
    assert dispatch_order(sent, [1.02, 1.0, 1.01, 2.0], tie_s=0.05) == Order(3, 3, 0)
    assert dispatch_order(sent, [1.02, 1.0, 1.01, 2.0], tie_s=0.001) == Order(6, 4, 2)
    assert dispatch_order([], []) == Order(0, 0, 0)


def test_overhead_is_request_to_first_token_less_the_pods_own_start() -> None:
    assert overhead(sent=100.0, first_token=112.5, created=103.0, ready=111.0) == pytest.approx(4.5)


def test_both_deployments_pass_admission_at_zero() -> None:
    single, split = deployments()
    assert (single["metadata"]["name"], split["metadata"]["name"]) == (SINGLE, SPLIT)
    for doc in (single, split):
        spec = LLMDeploymentSpec.model_validate(doc["spec"])
        assert spec.autoscaling is not None and spec.autoscaling.min_replicas == 0
        assert spec.autoscaling.max_replicas == 1
    parallel = LLMDeploymentSpec.model_validate(split["spec"]).parallelism
    assert (parallel.tensor, parallel.pipeline) == (1, 2)
    assert "parallelism" not in single["spec"]  # the split is a copy: the single one is untouched


def _pod(name: str, *, scheduled: bool = False, running: bool = False, ready: bool = False) -> dict[str, Any]:
    conditions = [
        {"type": "PodScheduled", "status": str(scheduled), "lastTransitionTime": "2026-11-30T12:00:02Z"},
        {"type": "Ready", "status": str(ready), "lastTransitionTime": "2026-11-30T12:00:09Z"},
    ]
    state = {"running": {"startedAt": "2026-11-30T12:00:05Z"}} if running else {"waiting": {}}
    return {
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"llmoperator.io/deployment": "d"},
                     "creationTimestamp": "2026-11-30T12:00:01Z"},
        "status": {"conditions": conditions, "containerStatuses": [{"state": state}, {"state": state}]},
    }  # fmt: skip


def test_a_pods_phases_are_read_from_its_object() -> None:
    assert pod_phases(_pod("p")) == {"created"}
    assert pod_phases(_pod("p", scheduled=True)) == {"created", "scheduled"}
    assert pod_phases(_pod("p", scheduled=True, running=True, ready=True)) == {
        "created", "scheduled", "started", "ready"
    }  # fmt: skip
    no_containers = _pod("p", scheduled=True)
    no_containers["status"]["containerStatuses"] = []
    assert "started" not in pod_phases(no_containers)


def test_a_poll_records_each_phase_once_every_pod_of_a_group_reached_it() -> None:
    phases = Phases(Kubectl(Path("/nonexistent")), "http://unused", "ns", "d")
    asked = {"kind": "LLMDeployment", "metadata": {"name": "d"}, "spec": {"replicas": 1}}
    other = {"kind": "Pod", "metadata": {"name": "x", "labels": {"llmoperator.io/deployment": "e"}}}
    phases._saw([{"kind": "LLMDeployment", "metadata": {"name": "d"}, "spec": {"replicas": 0}}], 1.0)
    assert phases.first == {}
    phases._saw([asked, other, _pod("d-0", scheduled=True)], 2.0)
    assert phases.first == {"replicas": 2.0, "created": 2.0, "scheduled": 2.0}
    # The worker appears unscheduled: the group is not all scheduled, but "scheduled" stays as seen.
    phases._saw([asked, _pod("d-0", scheduled=True, running=True, ready=True), _pod("d-g0-1")], 3.0)
    assert "started" not in phases.first
    assert set(phases.api_times()) == {"created"}, "a member not yet Ready: the group is not Ready"
    phases._saw([asked, _pod("d-0", scheduled=True, running=True, ready=True),
                 _pod("d-g0-1", scheduled=True, running=True, ready=True)], 4.0)  # fmt: skip
    assert phases.first == {"replicas": 2.0, "created": 2.0, "scheduled": 2.0, "started": 4.0, "ready": 4.0}
    api = phases.api_times()
    assert {phase: at - api["created"] for phase, at in api.items()} == {
        "created": 0.0, "scheduled": 1.0, "started": 4.0, "ready": 8.0
    }  # fmt: skip


def test_the_first_token_is_the_first_data_event_after_the_comments() -> None:
    answer = Streamed(0.0, lines=[(5.0, ": waking"), (5.0, ""), (9.5, 'data: {"choices": []}'), (9.6, "")])
    assert answer.first_token == 9.5
    assert Streamed(0.0, lines=[(5.0, ": waking")]).first_token is None


def test_a_watch_is_read_object_by_object_as_kubectl_prints_it(tmp_path: Path) -> None:
    """kubectl's `--watch --output=json` prints each object indented, a `}` line closing it."""
    asked = {"kind": "LLMDeployment", "metadata": {"name": "d"}, "spec": {"replicas": 1}}
    printed = tmp_path / "watch.json"
    printed.write_text(
        json.dumps(_pod("d-0", scheduled=True), indent=4) + "\n" + json.dumps(asked, indent=4) + "\n"
    )
    phases = Phases(Kubectl(Path("/nonexistent")), "http://unused", "ns", "d")
    with subprocess.Popen(["cat", str(printed)], stdout=subprocess.PIPE, text=True) as watch:
        phases._read(watch)
    assert set(phases.first) == {"created", "scheduled", "replicas"}
    assert phases.pods["d-0"]["metadata"]["creationTimestamp"] == "2026-11-30T12:00:01Z"
