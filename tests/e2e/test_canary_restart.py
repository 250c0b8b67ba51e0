"""A canary rollout on real pods whose operator is killed mid-step and started again: it resumes the
same step with the time left (the step's timer lives in status, not in the process). Apart from
test_canary.py because it stops its module's own operator.

Needs the embedded cluster (its monitoring stack and the real node).
"""

from __future__ import annotations

import time

import pytest

from e2e.cluster import canary
from e2e.cluster.canary import NAME, revisions
from e2e.cluster.testing import Kubectl
from tests.e2e.operator_fixtures import OperatorProcess
from tests.e2e.test_canary import epoch_seconds, get, start, wait_revisions

pytestmark = [pytest.mark.e2e, pytest.mark.own_operator]  # kills and restarts it mid-rollout


def test_f_a_restarted_operator_resumes_the_same_step_with_the_time_left(
    operator_process: OperatorProcess, prometheus: str, kubectl: Kubectl, namespace: str
) -> None:
    pause, down = 30, 12  # the operator is away for `down` s of the step's `pause`
    v1 = canary.without_analysis(canary.deployment(prometheus, steps=[{"weight": 50, "pauseSeconds": pause}]))
    start(kubectl, namespace, v1)
    kubectl.apply(canary.with_env(v1, RELEASE_NOTE="v2"), namespace=namespace)
    step = wait_revisions(kubectl, namespace, "the step's timer started", lambda r: r.get("stepStartedAt"))
    operator_process.kill()
    time.sleep(max(0.0, epoch_seconds(step["stepStartedAt"]) + down - time.time()))
    operator_process.start()
    operator_process.wait_healthy()
    back = time.time() - epoch_seconds(step["stepStartedAt"])
    resumed = revisions(get(kubectl, namespace))
    assert resumed["phase"] == "Progressing" and resumed["stepStartedAt"] == step["stepStartedAt"], resumed
    done = wait_revisions(kubectl, namespace, "promoted", lambda r: r.get("stable") == step["canary"])
    assert done["stableSlot"] == "b", done
    # When the step ended, by the Event the restarted operator posted: after the whole pause, and
    # before a whole pause after the restart (the timer lives in status, not in the process).
    (completed,) = [e for e in kubectl.events(namespace, NAME) if e.get("reason") == "CanaryStepCompleted"]
    ended = epoch_seconds(completed["lastTimestamp"]) - epoch_seconds(step["stepStartedAt"])
    print(f"operator back {back:.0f} s into a {pause} s step: the step ended {ended:.0f} s after it started")
    assert pause <= ended < back + pause - 2, (ended, back)
