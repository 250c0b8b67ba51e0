"""What a user puts into the serving pods (spec.runtime env, envFrom, pull secrets, ServiceAccount,
pod labels and annotations) reaches the pods the real StatefulSet controller creates, and the
engine build's pods, with the operator's own keys untouched."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster.testing import Kubectl, is_true, wait_for

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TIMEOUT = 90

RUNTIME: dict[str, Any] = {
    "env": [
        {"name": "GREETING", "value": "hello"},
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}},
    ],
    "envFrom": [{"configMapRef": {"name": "serving-settings"}, "prefix": "APP_"}],
    "imagePullSecrets": [{"name": "registry-cred"}],
    "serviceAccountName": "llm-serving",
    "podLabels": {"team": "ml-platform"},
    "podAnnotations": {"example.com/owner": "ml-platform"},
}


def test_runtime_pod_settings_reach_the_pods(operator: None, kubectl: Kubectl, namespace: str) -> None:
    kubectl.apply(
        [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "llm-serving"}},
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf-token"},
             "stringData": {"token": "not-a-real-token"}},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "serving-settings"},
             "data": {"MODE": "demo"}},
        ],
        namespace=namespace,
    )  # fmt: skip
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / "cpu-reference.yaml").read_text())
    doc["spec"]["runtime"].update(copy.deepcopy(RUNTIME))
    doc["spec"]["resources"]["cpu"] = "250m"  # the real node has 2 CPUs, shared with other tests' pods
    kubectl.apply(doc, namespace=namespace)
    wait_for(
        "tiny-llama Ready",
        lambda: kubectl.get("llmdeployment", "tiny-llama", namespace),
        lambda o: is_true(o, "Ready"),
        timeout=TIMEOUT,
    )
    (pod,) = kubectl.items("pods", namespace, "llmoperator.io/deployment=tiny-llama")
    spec, (container,) = pod["spec"], pod["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["GREETING"]["value"] == "hello"
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}
    assert env["LLMOP_BACKEND"]["value"] == "cpu-reference", "the contract's variables stay"
    assert container["envFrom"] == [{"configMapRef": {"name": "serving-settings"}, "prefix": "APP_"}]
    assert spec["serviceAccountName"] == "llm-serving" and spec["automountServiceAccountToken"] is False
    assert spec["imagePullSecrets"] == [{"name": "registry-cred"}]
    labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
    assert labels["team"] == "ml-platform" and labels["llmoperator.io/deployment"] == "tiny-llama"
    assert annotations["example.com/owner"] == "ml-platform"

    # An edit to the pod settings rolls the pods, like any change to what they run.
    revision = labels["llmoperator.io/revision"]
    kubectl("patch", "llmdeployment", "tiny-llama", "--type=merge",
            "-p", '{"spec":{"runtime":{"podLabels":{"team":"search"}}}}', namespace=namespace)  # fmt: skip
    wait_for(
        "the pod replaced with the new label",
        lambda: kubectl.items("pods", namespace, "llmoperator.io/deployment=tiny-llama"),
        lambda pods: (
            [p["metadata"]["labels"].get("team") for p in pods] == ["search"]
            and pods[0]["metadata"]["labels"]["llmoperator.io/revision"] != revision
        ),
        timeout=TIMEOUT,
    )
