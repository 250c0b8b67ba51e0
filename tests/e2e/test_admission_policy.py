"""The chart's ValidatingAdmissionPolicy on the embedded cluster's real API server: the objects
`helm template` renders from the chart's values are installed (bound to this test's namespace
only: the cluster is shared), then every field that names an image, a ServiceAccount, a Secret, the
model store's endpoint, environment names that load code, a scheduling privilege, or pod
annotations and labels is refused outside the allowed lists with the policy's message, an allowed
spec is accepted, and an
object admitted before the policy can still be relabelled (kopf's metadata patches) but not
changed. Server-side dry runs: nothing is stored but the one pre-existing object."""

from __future__ import annotations

import copy
import json
import secrets
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster.testing import E2ECluster, Kubectl, wait_for
from tests.e2e.test_chart_install import Helm
from tests.unit.test_chart import CHART

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
VALUES: dict[str, Any] = {
    "admissionPolicy": {
        "enabled": True,
        "allowedImagePrefixes": ["registry.example/llm/"],
        "allowedServiceAccountNames": ["llm-serving"],
        "allowedSecretNames": ["hf-token", "regcred"],
        "allowedEndpoints": ["https://hub-mirror.example"],
        "allowedConfigMapNames": ["serving-env"],
        "allowedPriorityClassNames": ["llm-serving"],
        "allowedTolerationKeys": ["dedicated"],
        "allowedPodAnnotations": ["prometheus.io/", "example.com/team"],
        "allowedPodLabels": ["team"],
    }
}
# One field each, outside the lists, and the start of the policy's message for it.
DENIED: list[tuple[str, dict[str, Any], str]] = [
    ("runtime image", {"runtime": {"image": "evil.example/triton:1"}}, "spec.runtime.image must start"),
    ("build image", {"engine": {"build": {"image": "registry.example/llmx:1"}}}, "spec.engine.build.image"),
    ("service account", {"runtime": {"serviceAccountName": "default"}}, "spec.runtime.serviceAccountName"),
    (
        "env secret",
        {"runtime": {"env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "db", "key": "k"}}}]}},
        "spec.runtime.env[].valueFrom.secretKeyRef.name",
    ),
    ("envFrom secret", {"runtime": {"envFrom": [{"secretRef": {"name": "db"}}]}}, "spec.runtime.envFrom[]"),
    ("pull secret", {"runtime": {"imagePullSecrets": [{"name": "db"}]}}, "spec.runtime.imagePullSecrets[]"),
    (
        "credentials",
        {"model": {"source": {"credentialsSecretRef": {"name": "db"}}}},
        "spec.model.source.credentialsSecretRef.name",
    ),
    ("api keys", {"routing": {"apiKeys": {"secretRef": {"name": "db"}}}}, "spec.routing.apiKeys.secretRef"),
    ("endpoint", {"model": {"source": {"endpoint": "http://127.0.0.1:9"}}}, "spec.model.source.endpoint"),
    ("LD_PRELOAD", {"runtime": {"env": [{"name": "LD_PRELOAD", "value": "/m/x.so"}]}}, "spec.runtime.env[]"),
    ("NCCL plugin", {"runtime": {"env": [{"name": "NCCL_NET_PLUGIN", "value": "x"}]}}, "spec.runtime.env[]"),
    ("PYTHONPATH", {"runtime": {"env": [{"name": "PYTHONPATH", "value": "/models"}]}}, "spec.runtime.env[]"),
    ("unprefixed ConfigMap", {"runtime": {"envFrom": [{"configMapRef": {"name": "any"}}]}},
     "spec.runtime.envFrom[].configMapRef"),
    # "L" + a key "D_PRELOAD" would make LD_PRELOAD: a prefix that starts a denied one is refused.
    ("prefix L", {"runtime": {"envFrom": [{"configMapRef": {"name": "any"}, "prefix": "L"}]}},
     "spec.runtime.envFrom[].prefix"),
    ("prefix LLMOP_X", {"runtime": {"envFrom": [{"secretRef": {"name": "hf-token"}, "prefix": "LLMOP_X"}]}},
     "spec.runtime.envFrom[].prefix"),
    ("priority class", {"placement": {"priorityClassName": "system-node-critical"}},
     "spec.placement.priorityClassName"),
    ("toleration", {"placement": {"tolerations": [{"key": "node-role.kubernetes.io/control-plane",
                                                   "operator": "Exists"}]}}, "spec.placement.tolerations[]"),
    ("wildcard toleration", {"placement": {"tolerations": [{"operator": "Exists"}]}},
     "spec.placement.tolerations[]"),
    ("mesh annotation", {"runtime": {"podAnnotations": {"sidecar.istio.io/inject": "false"}}},
     "spec.runtime.podAnnotations"),
    ("IAM annotation", {"runtime": {"podAnnotations": {"iam.amazonaws.com/role": "admin"}}},
     "spec.runtime.podAnnotations"),
    ("label", {"runtime": {"podLabels": {"role": "db-client"}}}, "spec.runtime.podLabels"),
]  # fmt: skip
ALLOWED: dict[str, Any] = {
    "model": {"source": {"credentialsSecretRef": {"name": "hf-token"}}},
    "routing": {"apiKeys": {"secretRef": {"name": "regcred"}}},
    "engine": {"build": {"image": "registry.example/llm/builder:1"}},
    "runtime": {
        "image": "registry.example/llm/triton:1",
        "serviceAccountName": "llm-serving",
        "env": [
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}},
            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "any", "key": "mode"}}},
        ],
        "envFrom": [
            {"secretRef": {"name": "hf-token"}},
            {"configMapRef": {"name": "serving-env"}},
            {"configMapRef": {"name": "any"}, "prefix": "APP_"},
        ],
        "imagePullSecrets": [{"name": "regcred"}],
        "podAnnotations": {"prometheus.io/scrape": "true", "example.com/team": "ml"},
        "podLabels": {"team": "ml"},
    },
    "placement": {
        "priorityClassName": "llm-serving",
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}],
    },
}
ALLOWED_HUB = {"model": {"source": {"uri": "hf://meta-llama/Llama-3.1-70B-Instruct",
                                    "endpoint": "https://hub-mirror.example/"}}}  # fmt: skip


def merged(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in change.items():
        out[key] = merged(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def deployment(name: str, change: dict[str, Any]) -> dict[str, Any]:
    """examples/llama3-70b-fp8.yaml (an s3:// checkpoint, an engine build) with `change`."""
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "llama3-70b-fp8.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["spec"] = merged(doc["spec"], change)
    return doc


def dry_run_create(kubectl: Kubectl, doc: dict[str, Any], namespace: str) -> subprocess.CompletedProcess[str]:
    text = json.dumps(doc)
    return kubectl("create", "--dry-run=server", "-f", "-", input=text, namespace=namespace, check=False)


def server_version(kubectl: Kubectl) -> str:
    version: str = kubectl.json("version")["serverVersion"]["gitVersion"]
    return version.lstrip("v").split("-")[0].split("+")[0]


def test_the_policy_refuses_what_the_lists_do_not_allow(
    crd: None, cluster: E2ECluster, kubectl: Kubectl, namespace: str
) -> None:
    version = server_version(kubectl)
    assert tuple(int(p) for p in version.split(".")[:2]) >= (1, 30), f"kube-apiserver {version}: needs 1.30+"
    served = kubectl("api-resources", "--api-group=admissionregistration.k8s.io", "-o", "name").stdout.split()
    assert "validatingadmissionpolicies.admissionregistration.k8s.io" in served, served
    # The CRD's own rule, policy or not: credentials only for a checkpoint that is downloaded.
    pvc = {"model": {"source": {"uri": "pvc://models/llama", "credentialsSecretRef": {"name": "hf-token"}}}}
    refused = dry_run_create(kubectl, deployment("pvc", pvc), namespace)
    assert refused.returncode != 0 and "credentialsSecretRef is for s3://" in refused.stderr, refused.stderr
    # Admitted before the policy exists, with an image the policy will not allow.
    kubectl.apply(deployment("before", {"runtime": {"image": "evil.example/triton:1"}}), namespace=namespace)

    helm, name = Helm(cluster), f"llmop-{secrets.token_hex(3)}"
    values = merged(VALUES, {"admissionPolicy": {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
    }})  # fmt: skip
    rendered = subprocess.run(
        [*helm.argv, "template", name, str(CHART), "--namespace", namespace, "--kube-version", version,
         "--show-only", "templates/admission-policy.yaml", "-f", "-"],
        input=yaml.safe_dump(values), capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    objects = [d for d in yaml.safe_load_all(rendered) if d]
    assert [d["kind"] for d in objects] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    kubectl.apply(rendered)
    try:
        # The API server compiles the policy and its binding asynchronously: refused once effective.
        _, first_change, first_message = DENIED[0]
        wait_for(
            "the policy to refuse a runtime image outside the allowed prefixes",
            lambda: dry_run_create(kubectl, deployment("probe", first_change), namespace),
            lambda r: r.returncode != 0 and first_message in r.stderr,
            timeout=60,
        )
        for what, change, message in DENIED:
            result = dry_run_create(kubectl, deployment("denied", change), namespace)
            assert result.returncode != 0, f"{what}: admitted"
            assert f"denied request: {message}" in result.stderr, (what, result.stderr)
        for spec in ({}, ALLOWED, ALLOWED_HUB):  # the operator's defaults, and all the lists allow
            result = dry_run_create(kubectl, deployment("allowed", spec), namespace)
            assert result.returncode == 0, result.stderr
        # The object admitted earlier: metadata-only updates pass (kopf removes a finalizer this
        # way), a spec change is judged like a create.
        kubectl("label", "llmdeployment", "before", "team=ml", namespace=namespace)
        scaled = kubectl("patch", "llmdeployment", "before", "--type=merge", "-p", '{"spec":{"replicas":2}}',
                         "--dry-run=server", namespace=namespace, check=False)  # fmt: skip
        assert scaled.returncode != 0 and "spec.runtime.image must start" in scaled.stderr, scaled.stderr
    finally:
        for obj in reversed(objects):
            kubectl.delete(obj["kind"].lower(), obj["metadata"]["name"])
