"""Serving objects made by an operator before slots, taken over by this one on a real control plane.

The slot label is new in every StatefulSet selector, and a selector cannot change: the operator
replaces such a StatefulSet. Its pods must keep serving through it: they are relabelled, orphaned
and adopted by the new StatefulSet, which rolls them one at a time.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster.testing import Kubectl, is_true, pod_ready, wait_for
from tests.e2e.operator_fixtures import OperatorProcess

pytestmark = [pytest.mark.e2e, pytest.mark.own_operator]  # stops it for an upgrade

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TIMEOUT = 120
SLOT = "llmoperator.io/slot"
SELECTOR = "llmoperator.io/deployment=tiny-llama"


def rolled_out(sts: dict[str, Any] | None, replicas: int) -> bool:
    st = (sts or {}).get("status") or {}
    return bool(
        sts is not None
        and st.get("observedGeneration") == sts["metadata"].get("generation")
        and st.get("readyReplicas") == st.get("updatedReplicas") == replicas
        and st.get("currentRevision") == st.get("updateRevision")
    )


def wait_ready(kubectl: Kubectl, namespace: str) -> None:
    wait_for(
        "tiny-llama Ready",
        lambda: kubectl.get("llmd", "tiny-llama", namespace),
        lambda o: is_true(o, "Ready"),
        timeout=TIMEOUT,
    )


def as_before_slots(kubectl: Kubectl, namespace: str) -> dict[str, Any]:
    """Replace the operator's StatefulSet by the one an operator before slots made (no slot label
    in its selector and pod template) and wait until its pods run that template."""
    sts = kubectl.get("statefulset", "tiny-llama", namespace)
    assert sts is not None and SLOT in sts["spec"]["selector"]["matchLabels"]
    kubectl("delete", "statefulset", "tiny-llama", "--cascade=orphan", namespace=namespace)
    wait_for(
        "the StatefulSet gone",
        lambda: kubectl.get("statefulset", "tiny-llama", namespace),
        lambda s: s is None,
    )
    kubectl("label", "pods", "-l", SELECTOR, f"{SLOT}-", namespace=namespace)
    old = copy.deepcopy(sts)
    del old["status"]
    old["metadata"] = {
        k: v for k, v in sts["metadata"].items() if k in ("name", "namespace", "labels", "ownerReferences")
    }
    del old["metadata"]["labels"][SLOT]
    del old["spec"]["selector"]["matchLabels"][SLOT]
    del old["spec"]["template"]["metadata"]["labels"][SLOT]
    # JSON, not PyYAML: a hash label like 5e123456 is a string to PyYAML and a number to kubectl.
    kubectl("create", "-f", "-", namespace=namespace, input=json.dumps(old))
    made = wait_for(
        "the old-style StatefulSet rolled out",
        lambda: kubectl.get("statefulset", "tiny-llama", namespace),
        lambda s: rolled_out(s, 2),
        timeout=TIMEOUT,
    )
    assert made is not None
    return made


def test_a_statefulset_from_before_slots_is_replaced_while_it_keeps_serving(
    operator_process: OperatorProcess, kubectl: Kubectl, namespace: str
) -> None:
    doc = yaml.safe_load((EXAMPLES / "cpu-reference.yaml").read_text())
    doc["spec"].update(replicas=2)
    doc["spec"]["resources"]["cpu"] = "250m"  # the real node has 2 CPUs, shared with other tests' pods
    kubectl.apply(doc, namespace=namespace)
    wait_ready(kubectl, namespace)

    operator_process.stop()  # the upgrade: an older operator's objects, then this one starts
    old = as_before_slots(kubectl, namespace)
    log_start = len(operator_process.log())
    fewest: list[int] = []
    stop = threading.Event()

    def count_ready() -> None:
        while not stop.is_set():
            pods = kubectl.items("pods", namespace, SELECTOR)
            fewest.append(sum(1 for p in pods if pod_ready(p) and not p["metadata"].get("deletionTimestamp")))
            time.sleep(0.3)

    watcher = threading.Thread(target=count_ready, daemon=True)
    watcher.start()
    try:
        operator_process.start()
        operator_process.wait_healthy()
        new = wait_for(
            "the StatefulSet replaced (slot in its selector) and rolled out",
            lambda: kubectl.get("statefulset", "tiny-llama", namespace),
            lambda s: s is not None and SLOT in s["spec"]["selector"]["matchLabels"] and rolled_out(s, 2),
            timeout=TIMEOUT,
        )
        assert new is not None
    finally:
        stop.set()
        watcher.join()
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    assert "replacing it" in operator_process.log(log_start)
    assert fewest and min(fewest) >= 1, f"a moment without a Ready pod: {fewest}"
    for pod in kubectl.items("pods", namespace, SELECTOR):
        assert pod["metadata"]["labels"][SLOT] == "a"
        assert pod["metadata"]["ownerReferences"][0]["uid"] == new["metadata"]["uid"]
    history = kubectl.items("controllerrevisions", namespace, SELECTOR)
    assert history and all(h["metadata"].get("ownerReferences") for h in history), "no history left behind"
    wait_ready(kubectl, namespace)
