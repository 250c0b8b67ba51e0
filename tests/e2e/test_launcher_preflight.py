"""A serving pod whose launcher finds a file missing, on the embedded cluster's real node with the
cpu-runtime image: the launcher exits 78 with one line naming the path, and the LLMDeployment is
Stalled (LauncherRefused) in those words with a Warning Event, while a healthy deployment next to it
keeps serving; a rolling update of that healthy deployment into the same mistake stops at its first
new pod, and the old one goes on serving.

The trigger is runtime.tokenizerUri on a claim whose directory holds no tokenizer: the pod mounts
the claim read-only and the launcher's preflight (runtime/preflight.py) checks the directory
before Triton starts, on the CPU image exactly as on NVIDIA's.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator.contract import OPENAI_PORT

from e2e.cluster.testing import E2ECluster, Kubectl, condition, is_true, wait_for
from e2e.generate import connection, stream

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STALL_WITHIN = 180  # seconds from apply: an image already on the node, one start of the launcher


def tiny_llama(name: str, replicas: int = 1, **runtime: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / "cpu-reference.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["replicas"] = replicas
    doc["spec"]["resources"].update(cpu="250m", memory="1Gi")
    doc["spec"]["runtime"].update(runtime)
    return doc


@pytest.fixture
def empty_claim(kubectl: Kubectl, namespace: str) -> Iterator[str]:
    """A claim bound to an empty directory of the node (hostPath: the real node's filesystem)."""
    pv = f"{namespace}-tokenizers"
    kubectl.apply(
        [
            {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
             "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadOnlyMany"],
                      "storageClassName": "", "persistentVolumeReclaimPolicy": "Retain",
                      "hostPath": {"path": f"/tmp/{pv}", "type": "DirectoryOrCreate"},
                      "claimRef": {"namespace": namespace, "name": "tokenizers"}}},
            {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": "tokenizers", "namespace": namespace},
             "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": pv,
                      "resources": {"requests": {"storage": "1Gi"}}}},
        ]
    )  # fmt: skip
    yield "tokenizers"
    kubectl.delete_namespace(namespace)
    kubectl.delete("persistentvolume", pv)
    # A Retain volume's directory outlives it; on the embedded cluster the node's /tmp is this
    # machine's (elsewhere there is nothing here to remove).
    with contextlib.suppress(OSError):
        Path(f"/tmp/{pv}").rmdir()


def test_a_missing_tokenizer_stalls_in_the_launchers_words_and_the_neighbour_keeps_serving(
    operator: None, cluster: E2ECluster, kubectl: Kubectl, namespace: str, empty_claim: str
) -> None:
    if cluster.launcher is None:
        pytest.skip("needs the embedded cluster's real node and cpu-runtime image")
    kubectl.apply(tiny_llama("steady", replicas=2), namespace=namespace)
    wait_for("steady Ready", lambda: is_true(kubectl.get("llmdeployment", "steady", namespace), "Ready"),
             timeout=300)  # fmt: skip
    started = time.monotonic()
    kubectl.apply(tiny_llama("refused", tokenizerUri=f"pvc://{empty_claim}/tiny-llama"), namespace=namespace)
    line = (
        "/tokenizer-source/tiny-llama/tokenizer.json not found (nor tokenizer.model, vocab.json, vocab.txt)"
    )

    def stalled() -> dict[str, Any] | None:
        ld = kubectl.get("llmdeployment", "refused", namespace)
        return ld if is_true(ld, "Stalled") else None

    ld = wait_for("refused Stalled", stalled, timeout=STALL_WITHIN)
    took = time.monotonic() - started
    stall = condition(ld, "Stalled") or {}
    assert stall["reason"] == "LauncherRefused" and ld is not None, stall
    assert ld["status"]["reason"] == "LauncherRefused" and ld["status"]["phase"] == "Failed"
    assert f"LauncherRefused: {line}" in stall["message"], stall["message"]
    # The pod's own record: exit 78, the launcher's line as its termination message.
    (pod,) = kubectl.items("pods", namespace, "llmoperator.io/deployment=refused")
    (container,) = pod["status"]["containerStatuses"]
    ended = (container.get("state") or {}).get("terminated") or (container.get("lastState") or {})[
        "terminated"
    ]
    assert ended["exitCode"] == 78 and ended["message"].startswith(line), ended
    events = wait_for(
        "a LauncherRefused Warning Event",
        lambda: [e for e in kubectl.events(namespace, "refused")
                 if e["type"] == "Warning" and e["reason"] == "LauncherRefused"],
    )  # fmt: skip
    assert any(line in e["message"] for e in events), events

    # The neighbour is untouched: still Ready, and it answers.
    steady = kubectl.get("llmdeployment", "steady", namespace)
    assert is_true(steady, "Ready") and not is_true(steady, "Stalled"), steady
    answers(cluster, kubectl, namespace)
    print(f"Stalled (LauncherRefused) {took:.0f} s after apply: {stall['message']}")

    # The same mistake as a rolling update: the StatefulSet replaces one pod, whose launcher
    # refuses, and waits for it; the other, of the old template, keeps serving.
    kubectl.apply(tiny_llama("steady", replicas=2, tokenizerUri=f"pvc://{empty_claim}/tiny-llama"),
                  namespace=namespace)  # fmt: skip

    def steady_stalled() -> dict[str, Any] | None:
        ld = kubectl.get("llmdeployment", "steady", namespace)
        return ld if is_true(ld, "Stalled") else None

    ld = wait_for("steady Stalled by its rolling update", steady_stalled, timeout=STALL_WITHIN)
    assert ld is not None and (condition(ld, "Stalled") or {})["reason"] == "LauncherRefused", ld
    assert (condition(ld, "Degraded") or {})["reason"] == "StalledWhileServing", ld["status"]
    assert ld["status"]["phase"] == "Degraded" and ld["status"]["readyReplicas"] >= 1, ld["status"]
    answers(cluster, kubectl, namespace)


def answers(cluster: E2ECluster, kubectl: Kubectl, namespace: str) -> None:
    """steady streams tokens through its Service."""
    service = kubectl.get("service", "steady", namespace)
    assert service is not None and cluster.launcher is not None
    conn = connection(service["spec"]["clusterIP"], OPENAI_PORT, inside=cluster.launcher.netns)
    chunks = list(stream(conn, "tiny-llama", "Once", 8))
    assert sum(len(c.text) for c in chunks) > 0, chunks
