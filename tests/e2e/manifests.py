"""LLMDeployments and storage the e2e tests apply (GPU deployments on prebuilt engines)."""

from __future__ import annotations

from typing import Any

from e2e.cluster.testing import Kubectl, wait_for


def deployment(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": {"name": "meta-llama/Meta-Llama-3-8B-Instruct", "source": {"uri": "pvc://engines/models/llama3-8b"}},
        "engine": {"backend": "tensorrt-engine", "precision": "bf16", "maxBatchSize": 8, "maxInputLen": 2048,
                   "maxSeqLen": 4096, "maxNumTokens": 4096, "prebuilt": {"uri": "pvc://engines/x"}},
        "replicas": 1,
        **spec,
    }  # fmt: skip
    return {
        "apiVersion": "llmoperator.io/v1alpha1",
        "kind": "LLMDeployment",
        "metadata": {"name": name},
        "spec": body,
    }


def engines_claim(kubectl: Kubectl, namespace: str) -> None:
    pv = f"{namespace}-engines"
    kubectl.apply(
        [
            {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
             "spec": {"capacity": {"storage": "1Ti"}, "accessModes": ["ReadWriteMany"],
                      "storageClassName": "", "hostPath": {"path": "/tmp/engines"},
                      "claimRef": {"namespace": namespace, "name": "engines"}}},
            {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": "engines", "namespace": namespace},
             "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv,
                      "resources": {"requests": {"storage": "1Ti"}}}},
        ]
    )  # fmt: skip
    # Bound before any pod asks for it: a pod the scheduler finds with an unbound claim can wait in
    # its unschedulable queue past the claim binding (seen: 90 s without a retry under load).
    wait_for(
        "claim engines Bound", lambda: kubectl.get("pvc", "engines", namespace),
        lambda o: o is not None and o.get("status", {}).get("phase") == "Bound", timeout=60,
    )  # fmt: skip
