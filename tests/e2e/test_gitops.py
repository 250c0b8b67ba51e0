"""What Flux (kstatus) and Argo CD (our health check) say of a live LLMDeployment the operator
really reconciles, computed by their own code (e2e/gitops.py) on `kubectl get -o json`."""

from __future__ import annotations

import json
from typing import Any

import pytest

from e2e.cluster.testing import Kubectl, condition, is_true, wait_for
from e2e.gitops import argocd_health, assert_kstatus, kstatus
from tests.e2e.test_operator import TIMEOUT, engine_cache, example, get_llmd

pytestmark = pytest.mark.e2e


def test_a_new_deployment_is_in_progress_before_the_operator_writes(
    crd: None, kubectl: Kubectl, namespace: str
) -> None:
    # The create response is the stored object before any controller saw it: the CRD's default
    # status, which kstatus must not read as Current (it would for an object without status).
    created = kubectl.json(
        "create", "-f", "-", namespace=namespace, input=json.dumps(example("cpu-reference.yaml"))
    )
    assert created["status"]["observedGeneration"] == 0
    assert_kstatus(created, "InProgress", "latest observed generation is 0")
    assert argocd_health(created) == {
        "status": "Progressing",
        "message": "Waiting for the operator to observe generation 1",
    }


def test_stalled_then_fixed_reads_failed_then_in_progress_then_current(
    operator: None, kubectl: Kubectl, namespace: str
) -> None:
    engine_cache(kubectl, namespace)
    doc = example("llama3-8b-h100.yaml")
    doc["spec"]["resources"]["gpu"]["products"] = ["NVIDIA-A10G"]
    doc["spec"]["parallelism"]["tensor"] = 8  # A10G nodes have 1 GPU and no NVLink
    doc["spec"]["engine"]["precision"] = "fp16"
    kubectl.apply(doc, namespace=namespace)
    ld = wait_for(
        "Stalled",
        lambda: get_llmd(kubectl, namespace, "llama3-8b"),
        lambda o: is_true(o, "Stalled"),
        timeout=TIMEOUT,
    )
    assert ld is not None
    stalled = condition(ld, "Stalled")
    assert stalled is not None
    assert_kstatus(ld, "Failed", stalled["message"])
    assert argocd_health(ld) == {"status": "Degraded", "message": stalled["message"]}

    # The fix: from the apply on, neither tool may read the old Stalled as this spec's verdict.
    doc["spec"]["parallelism"]["tensor"] = 1
    doc["spec"]["resources"]["gpu"]["products"] = ["NVIDIA-H100-80GB-HBM3"]
    kubectl.apply(doc, namespace=namespace)
    seen: list[tuple[str, str]] = []
    said: list[str] = []  # Argo CD's message at each change of verdict, for the assertion

    def judged() -> tuple[str, str, dict[str, Any] | None]:
        obj = get_llmd(kubectl, namespace, "llama3-8b")
        assert obj is not None
        health = argocd_health(obj)
        verdict = (kstatus(obj)[0], health["status"])
        if not seen or seen[-1] != verdict:
            seen.append(verdict)
            said.append(health["message"])
        return (*verdict, obj)

    _, _, ready = wait_for(
        "Current and Healthy", judged, lambda v: v[:2] == ("Current", "Healthy"), timeout=TIMEOUT
    )
    allowed = {("InProgress", "Progressing"), ("Current", "Healthy")}
    assert set(seen) <= allowed, list(zip(seen, said, strict=True))
    assert ready is not None and ready["status"]["observedGeneration"] == ready["metadata"]["generation"]
    assert_kstatus(ready, "Current")
    ready_condition = condition(ready, "Ready")
    assert ready_condition is not None and argocd_health(ready)["message"] == ready_condition["message"]
