"""The Helm chart: lint, every rendered object valid for Kubernetes 1.34, restricted security, least
privilege RBAC that still covers what the operator does, values schema, and the wiring to the
operator's own entry point and environment (so a renamed flag or variable fails here, not in a
cluster)."""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "llm-operator"
KUBE_VERSION = "1.34.0"  # the schemas kubernetes-validate ships for the cluster version we target


def find_helm() -> str | None:
    """The helm that `make tools` (e2e/cluster/build-tools.sh) unpacks into the cache, else the
    embedded cluster's link to it. Never a download: unit tests stay offline and quick."""
    cache = Path(os.environ.get("LLMOP_CACHE") or Path.home() / ".cache" / "llm-operator")
    pinned = re.search(r"^KUBECTL_WHEEL=\S+==(\S+)", (REPO / "e2e/cluster/build-tools.sh").read_text(), re.M)
    candidates = [cache / "bin" / f"kubectl-helm-{pinned.group(1)}" / "helm"] if pinned else []
    candidates += sorted(cache.glob("bin/kubectl-helm-*/helm"), reverse=True)
    candidates.append(REPO / ".cluster" / "bin" / "helm")
    return next((str(c) for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


HELM = find_helm()
needs_helm = pytest.mark.skipif(
    HELM is None, reason="helm not found under $LLMOP_CACHE/bin/kubectl-helm-*/: run `make tools`"
)
pytestmark = needs_helm


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    assert HELM is not None, "helm not found under $LLMOP_CACHE/bin/kubectl-helm-*/: run `make tools`"
    return subprocess.run([HELM, *args], capture_output=True, text=True, check=check, timeout=120)


# Non-default value sets: each changes every value it can, so a value the templates ignore shows.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "namespaces": {
        "watchNamespaces": ["team-a", "team-b"],
        "replicas": 3,
        "leaderElection": {"leaseDurationSeconds": 30, "renewDeadlineSeconds": 20, "retryPeriodSeconds": 4},
        "image": {"tag": "v9.1.0", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "serviceAccount": {"create": False, "name": "ops-operator"},
        "fetch": {"maxBytesPerSecond": 52428800},
        "operator": {
            "runtimeImage": "registry.example/triton:25.01",
            "cpuRuntimeImage": "registry.example/cpu:1",
            "engineBuilderImage": "registry.example/builder:2",
            "fetchImage": "registry.example/fetch:3",
            "pickerImage": "registry.example/epp:4",
            "envoyImage": "registry.example/envoy:5",
            "trtllmVersion": "0.21.0",
            "workers": 9,
            "logLevel": "DEBUG",
            "prometheusUrl": "https://prometheus.example:9443",
            "analysisPrometheusUrls": ["https://prometheus.example:9443", "http://thanos.example/prom/"],
            "extraEnv": [
                {"name": "HTTPS_PROXY", "value": "http://proxy:3128"},
                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            ],
        },
        "metrics": {
            "port": 9100,
            "serviceMonitor": {
                "enabled": True,
                "interval": "1m",
                "scrapeTimeout": "20s",
                "labels": {"release": "kube-prometheus"},
            },
        },
        "monitoring": {
            "podMonitor": {"enabled": True, "interval": "5s", "labels": {"release": "kube-prometheus"}},
            "recordingRules": {
                "enabled": True,
                "rateWindow": "20s",
                "interval": "5s",
                "labels": {"release": "kube-prometheus"},
            },
            "dashboard": {"enabled": True, "namespace": "grafana", "labels": {"team": "ml"}},
        },
        "healthPort": 9101,
        "admissionPolicy": {
            "enabled": True,
            "allowedImagePrefixes": ["registry.example/llm/"],
            "allowedServiceAccountNames": ["llm-serving"],
            "allowedSecretNames": ["hf-token", "regcred"],
            "allowedEndpoints": ["https://hub-mirror.example"],
            "allowedPriorityClassNames": ["llm-serving"],
            "validationActions": ["Warn", "Audit"],
            "namespaceSelector": {"matchLabels": {"llm.example/tenant": "true"}},
        },
        "networkPolicy": {"metricsPeers": ["monitoring", "192.0.2.7/32"]},
    },
    "customized": {
        "fullnameOverride": "llmop",
        "image": {"repository": "registry.example/llm-operator", "digest": "sha256:" + "ab" * 32},
        "serviceAccount": {"annotations": {"iam.gke.io/gcp-service-account": "op@p.iam.gserviceaccount.com"}},
        "rbac": {"create": False, "aggregatedRoles": False},
        "replicas": 1,
        "leaderElection": {"enabled": False},
        "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"cpu": 2, "memory": "2Gi"}},
        "podLabels": {"team": "ml"},
        "podAnnotations": {"example.com/owner": "ml-platform"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "DoesNotExist"}]}
                    ]
                }
            }
        },
        "priorityClassName": "system-cluster-critical",
        "networkPolicy": {"enabled": False, "metricsPeers": []},
    },
}


def helm_with_values(name: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """helm ARGS with the named value set on stdin (`-f -`): no files left behind."""
    assert HELM is not None, "helm not found under $LLMOP_CACHE/bin/kubectl-helm-*/: run `make tools`"
    values = yaml.safe_dump(VALUE_SETS[name])
    return subprocess.run(
        [HELM, *args, "-f", "-"], input=values, capture_output=True, text=True, check=check, timeout=120
    )


@functools.cache
def _render(name: str, include_crds: bool) -> str:
    args = ["template", "rel", str(CHART), "--namespace", "ops", "--kube-version", KUBE_VERSION]
    return helm_with_values(name, *args, *(["--include-crds"] if include_crds else [])).stdout


def render(name: str = "defaults", include_crds: bool = False) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(_render(name, include_crds)) if d]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def operator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return dict(container)


SETS = pytest.mark.parametrize("name", list(VALUE_SETS))


# --- chart metadata and lint -------------------------------------------------------------------


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["kubeVersion"] == ">=1.29.0-0", "the CRD's CEL rules use quantity functions (1.29+)"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"], "the default image tag is the operator's version"


def test_default_images_are_the_operators_and_follow_app_version(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The chart's default images are the ones the operator defaults to without the chart
    (`llm-operator run`), so both name what the release publishes (scripts/release.sh); a chart
    packaged with another appVersion (`helm package --app-version`, as the release does) names
    that version's images."""
    from llm_operator.controller.config import OperatorConfig
    from llm_operator.inject import content_tag

    for var in [v for v in os.environ if v.startswith("LLMOP_")]:
        monkeypatch.delenv(var)
    defaults = OperatorConfig.from_env().images
    env = {e["name"]: e.get("value") for e in operator_container(render())["env"]}
    assert f"{env['LLMOP_LAUNCHER_IMAGE_REPOSITORY']}:{content_tag()}" == defaults.launcher
    assert env["LLMOP_CPU_RUNTIME_IMAGE"] == defaults.cpu_runtime
    assert env["LLMOP_FETCH_IMAGE"] == defaults.fetch
    helm("package", str(CHART), "--app-version", "9.8.7", "--version", "9.8.7", "-d", str(tmp_path))
    packaged = helm("template", "rel", str(tmp_path / "llm-operator-9.8.7.tgz")).stdout
    deployment = one(list(yaml.safe_load_all(packaged)), "Deployment")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert {env[k] for k in ("LLMOP_CPU_RUNTIME_IMAGE", "LLMOP_FETCH_IMAGE")} == {
        "ghcr.io/llm-operator/llm-operator/cpu-runtime:9.8.7",
        "ghcr.io/llm-operator/llm-operator/fetch:9.8.7",
    }
    # The launcher's tag is the operator's to set, from content: another version names the same.
    assert env["LLMOP_LAUNCHER_IMAGE_REPOSITORY"] == "ghcr.io/llm-operator/llm-operator/launcher"


def test_launcher_repository_beside_the_operator_image_or_as_set() -> None:
    def launcher_repository(*sets: str) -> str:
        out = helm("template", "rel", str(CHART), *(a for s in sets for a in ("--set", s))).stdout
        env = operator_container([d for d in yaml.safe_load_all(out) if d])["env"]
        return str(next(e["value"] for e in env if e["name"] == "LLMOP_LAUNCHER_IMAGE_REPOSITORY"))

    assert launcher_repository("image.repository=registry.example.com:5000/team/operator") == (
        "registry.example.com:5000/team/launcher"
    )
    assert launcher_repository("operator.launcherImage.repository=mirror.example.com/launcher") == (
        "mirror.example.com/launcher"
    )
    tagged = helm("template", "rel", str(CHART), "--set", "operator.launcherImage.repository=x/launcher:1",
                  check=False)  # fmt: skip
    assert tagged.returncode != 0 and "launcherImage" in tagged.stderr, "a tag is the operator's to set"


@SETS
def test_lint_strict(name: str) -> None:
    result = helm_with_values(name, "lint", "--strict", str(CHART), check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_kube_version_floor() -> None:
    too_old = helm("template", "rel", str(CHART), "--kube-version", "1.28.9", check=False)
    assert too_old.returncode != 0 and "kubeVersion" in too_old.stderr, too_old.stderr
    helm("template", "rel", str(CHART), "--kube-version", "1.29.0")


# --- every object valid, labelled, in the right namespace --------------------------------------

CLUSTER_SCOPED = {
    "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}  # fmt: skip
OTHER_NAMESPACES = ("team-a", "team-b", "grafana")  # watched namespaces; the dashboard's


@SETS
def test_rendered_objects_validate_against_kubernetes_schemas(name: str) -> None:
    docs = render(name, include_crds=True)
    kinds = [d["kind"] for d in docs]
    assert kinds.count("CustomResourceDefinition") == 1 and kinds.count("Deployment") == 1, kinds
    for doc in docs:
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] in ("ServiceMonitor", "PodMonitor", "PrometheusRule"):
            # Prometheus Operator CRDs: not in the Kubernetes schemas (test_monitoring_rules.py)
            assert doc["apiVersion"] == "monitoring.coreos.com/v1"
            if doc["kind"] == "ServiceMonitor":
                assert set(doc["spec"]) == {"selector", "endpoints"}, where
        else:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        if doc["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in doc["metadata"], where
        else:
            assert doc["metadata"]["namespace"] in ("ops", *OTHER_NAMESPACES), where
        if doc["kind"] != "CustomResourceDefinition":  # generated by `make crds`, not templated
            labels = doc["metadata"]["labels"]
            for key in ("name", "instance", "version", "component", "managed-by", "part-of"):
                assert f"app.kubernetes.io/{key}" in labels, (where, key)
            assert labels["app.kubernetes.io/managed-by"] == "Helm"
            assert labels["helm.sh/chart"] == "llm-operator-0.1.0"


def test_chart_crd_is_the_generated_one() -> None:
    assert (CHART / "crds" / "llmdeployments.llmoperator.io.yaml").read_text() == (
        REPO / "crds" / "llmdeployments.llmoperator.io.yaml"
    ).read_text(), "run `make crds`: it writes crds/ and the chart's copy"


# --- the operator Deployment --------------------------------------------------------------------


@SETS
def test_restricted_operator_replicas_elect_a_leader_or_run_alone(name: str) -> None:
    docs = render(name)
    dep = one(docs, "Deployment")
    values = VALUE_SETS[name]
    if values.get("leaderElection", {}).get("enabled", True):
        assert dep["spec"]["replicas"] == values.get("replicas", 2)
        # A new standby is up before an old pod goes; the Lease keeps them from acting together.
        assert dep["spec"]["strategy"] == {
            "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
        }  # fmt: skip
    else:
        assert dep["spec"]["replicas"] == 1, "without leader election two operators must never act together"
        assert dep["spec"]["strategy"] == {"type": "Recreate"}
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    container = operator_container(docs)
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
    }  # fmt: skip
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert any(v["name"] == "tmp" and "emptyDir" in v for v in pod["volumes"])
    assert not pod.get("hostNetwork") and not pod.get("hostPID")
    resources = container["resources"]
    assert resources["requests"]["cpu"] and resources["requests"]["memory"] and resources["limits"]["memory"]
    # The selector must not also match the serving pods the operator labels name=llm-operator.
    selector = dep["spec"]["selector"]["matchLabels"]
    assert selector["app.kubernetes.io/component"] == "operator"
    assert selector.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert one(docs, "Service")["spec"]["selector"] == selector
    # Drains take the replicas one at a time; a single replica gets no budget (it would block them).
    budgets = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    if dep["spec"]["replicas"] > 1:
        assert [b["spec"] for b in budgets] == [{"maxUnavailable": 1, "selector": {"matchLabels": selector}}]
    else:
        assert budgets == []


def test_default_resources_and_image() -> None:
    container = operator_container(render())
    assert container["resources"] == {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"memory": "512Mi"},
    }
    assert container["image"] == "ghcr.io/llm-operator/llm-operator/operator:0.1.0"
    custom = operator_container(render("customized"))
    assert custom["image"] == "registry.example/llm-operator@sha256:" + "ab" * 32
    assert (
        operator_container(render("namespaces"))["image"]
        == "ghcr.io/llm-operator/llm-operator/operator:v9.1.0"
    )


def test_scheduling_values_reach_the_pod() -> None:
    values = VALUE_SETS["customized"]
    pod = one(render("customized"), "Deployment")["spec"]["template"]
    for key in ("nodeSelector", "tolerations", "affinity", "priorityClassName"):
        assert pod["spec"][key] == values[key], key
    assert pod["metadata"]["labels"]["team"] == "ml"
    assert pod["metadata"]["annotations"] == values["podAnnotations"]
    dep = one(render(), "Deployment")
    defaults = dep["spec"]["template"]["spec"]
    assert not {"nodeSelector", "tolerations", "priorityClassName"} & defaults.keys()
    # Replicas spread over nodes where they can, so losing one node leaves a standby.
    (term,) = defaults["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]


@SETS
def test_entry_point_args_parse_with_the_operators_cli(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The container runs the `llm-operator` console script; its args must mean what the values say."""
    from llm_operator import cli

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    container = operator_container(render(name))
    assert container["command"] == ["llm-operator"]
    assert project["scripts"]["llm-operator"] == "llm_operator.cli:main"
    parsed: list[Any] = []

    def fake_run(args: Any) -> int:
        parsed.append(args)
        return 0

    monkeypatch.setattr(cli, "run", fake_run)
    assert cli.main(container["args"]) == 0
    (args,) = parsed
    assert args.command == "run"
    namespaces = VALUE_SETS[name].get("watchNamespaces", [])
    assert args.namespace == (namespaces or None)
    assert args.all_namespaces is (not namespaces)


@SETS
def test_environment_is_what_the_operator_reads(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every LLMOP_* value the chart sets changes the operator's config the way values.yaml says."""
    from llm_operator.controller.config import OperatorConfig
    from llm_operator.controller.rollout.prometheus_urls import parse_list

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for key, val in VALUE_SETS[name].items():  # two-level merge is enough for these value sets
        values[key] = {**values[key], **val} if isinstance(val, dict) else val
    op = values["operator"]
    container = operator_container(render(name))
    names = [env["name"] for env in container["env"]]
    # The API server refuses a Deployment that lists a variable twice (server-side apply).
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    for var in [v for v in os.environ if v.startswith("LLMOP_")]:
        monkeypatch.delenv(var)
    for env in container["env"]:
        if "value" in env:
            monkeypatch.setenv(env["name"], env["value"])
    config = OperatorConfig.from_env()
    assert config.images.runtime == op["runtimeImage"]
    beside = values["image"]["repository"].rpartition("/")[0]  # empty: `<name>:<appVersion>` there
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert config.images.cpu_runtime == (op["cpuRuntimeImage"] or f"{beside}/cpu-runtime:{app_version}")
    assert config.images.engine_builder == op["engineBuilderImage"]
    assert config.images.fetch == (op["fetchImage"] or f"{beside}/fetch:{app_version}")
    assert config.images.picker == op["pickerImage"]
    assert config.images.envoy == op["envoyImage"]
    assert config.images.trtllm_version == op["trtllmVersion"]
    assert config.workers == op["workers"]
    assert config.prometheus_url == op["prometheusUrl"]
    assert config.metrics_peers == tuple(values["networkPolicy"]["metricsPeers"])
    assert config.analysis_prometheus_urls == parse_list(",".join(op["analysisPrometheusUrls"]), "values")
    assert config.fetch_max_bytes_per_second == values["fetch"]["maxBytesPerSecond"]
    assert isinstance(logging.getLevelName(os.environ["LLMOP_LOG_LEVEL"]), int)  # cli.run's basicConfig
    assert os.environ["LLMOP_LOG_LEVEL"] == op["logLevel"]
    assert config.metrics_port == values["metrics"]["port"]
    assert config.health_port == values["healthPort"]
    election = values["leaderElection"]
    if election["enabled"]:
        identity = next(e for e in container["env"] if e["name"] == "LLMOP_LEADER_ELECTION_IDENTITY")
        assert identity["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}, "the pod's name"
        assert config.leader_election is not None
        assert (config.leader_election.lease, config.leader_election.namespace) == ("rel-llm-operator", "ops")
        assert config.leader_election.lease_duration_seconds == election["leaseDurationSeconds"]
        assert config.leader_election.renew_deadline_seconds == election["renewDeadlineSeconds"]
        assert config.leader_election.retry_period_seconds == election["retryPeriodSeconds"]
    else:
        assert config.leader_election is None
    for extra in op["extraEnv"]:
        assert extra in container["env"]
    # Probe and ports point where the operator listens: http://:<health>/healthz, :<metrics>/metrics.
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": config.metrics_port, "health": config.health_port}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    service = one(render(name), "Service")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": config.metrics_port, "targetPort": "metrics", "protocol": "TCP"}
    ]


@SETS
def test_operator_pods_admit_only_the_metrics_port_from_the_monitoring_peers(name: str) -> None:
    from llm_operator.render.network import peer

    docs = render(name)
    values = VALUE_SETS[name].get("networkPolicy", {})
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    if values.get("enabled") is False:
        assert policies == []
        return
    (policy,) = policies
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    peers = values.get("metricsPeers", ["monitoring"])
    assert policy["spec"]["ingress"] == [
        {"from": [peer(p) for p in peers], "ports": [{"port": "metrics", "protocol": "TCP"}]}
    ], "the same peers, written the same way, as the serving pods' policies (LLMOP_METRICS_PEERS)"


def test_operator_pods_without_metrics_peers_admit_nothing() -> None:
    docs = yaml.safe_load_all(
        helm(
            "template", "rel", str(CHART), "--namespace", "ops", "--set", "networkPolicy.metricsPeers=null"
        ).stdout
    )
    (policy,) = [d for d in docs if d and d["kind"] == "NetworkPolicy"]
    assert policy["spec"]["ingress"] == []


def test_service_monitor_is_optional() -> None:
    assert not [d for d in render() if d["kind"] == "ServiceMonitor"]
    monitor = one(render("namespaces"), "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "1m", "scrapeTimeout": "20s"}
    ]
    assert (
        monitor["spec"]["selector"]["matchLabels"] == one(render("namespaces"), "Service")["spec"]["selector"]
    )


# --- RBAC ---------------------------------------------------------------------------------------


def granted(docs: list[dict[str, Any]], role: str) -> set[tuple[str, str, str]]:
    rules = one([d for d in docs if d["metadata"]["name"] == role], "ClusterRole")["rules"]
    return {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


@SETS
def test_rbac_has_no_wildcards_and_nothing_dangerous(name: str) -> None:
    user_roles = ("rel-llm-operator-view", "rel-llm-operator-edit", "llmop-view", "llmop-edit")
    roles = [d for d in render(name) if d["kind"] in ("ClusterRole", "Role")]
    roles = [r for r in roles if r["metadata"]["name"] not in user_roles]  # test_roles_for_people
    if VALUE_SETS[name].get("rbac", {}).get("create", True) is False:
        assert not roles and not [d for d in render(name) if "Binding" in d["kind"]]
        return
    assert roles
    for role in roles:
        for rule in role["rules"]:
            if role["kind"] == "Role":  # the Lease: in the release namespace, by name where possible
                assert role["metadata"]["namespace"] == "ops"
                assert rule["apiGroups"] == ["coordination.k8s.io"] and rule["resources"] == ["leases"], rule
                assert rule.get("resourceNames") == ["rel-llm-operator"] or rule["verbs"] == ["create"], rule
                continue
            assert set(rule) == {"apiGroups", "resources", "verbs"}, rule  # no resourceNames/nonResourceURLs
            for field in ("apiGroups", "resources", "verbs"):
                assert not any("*" in item for item in rule[field]), rule
            assert not {"escalate", "bind", "impersonate", "deletecollection"} & set(rule["verbs"]), rule
            assert not {"clusterroles", "clusterrolebindings"} & set(rule["resources"]), rule
            if {"roles", "rolebindings"} & set(rule["resources"]):
                # The router's Role (routing.mode inference-pool): namespaced, and without escalate
                # or bind the API server lets it grant only what the operator holds itself.
                assert set(rule["resources"]) == {"roles", "rolebindings"}, rule
                assert rule["apiGroups"] == ["rbac.authorization.k8s.io"], rule
            if "secrets" in rule["resources"]:  # the multi-node SSH key: made, never read
                assert rule["resources"] == ["secrets"] and rule["verbs"] == ["create"], rule


def test_roles_for_people_aggregate_into_view_edit_and_admin() -> None:
    docs = render()
    view, edit = granted(docs, "rel-llm-operator-view"), granted(docs, "rel-llm-operator-edit")
    group = "llmoperator.io"
    reads = {(group, r, v) for r in ("llmdeployments", "llmdeployments/status", "llmdeployments/scale")
             for v in ("get", "list", "watch")}  # fmt: skip
    assert view == reads
    writes = {
        (group, "llmdeployments", v) for v in ("create", "update", "patch", "delete", "deletecollection")
    }
    assert edit == reads | writes | {(group, "llmdeployments/scale", v) for v in ("update", "patch")}
    labels = {d["metadata"]["name"]: d["metadata"]["labels"] for d in docs if d["kind"] == "ClusterRole"}
    aggregate = "rbac.authorization.k8s.io/aggregate-to-"
    assert {k for k in labels["rel-llm-operator-view"] if k.startswith(aggregate)} == {aggregate + "view"}
    assert {k for k in labels["rel-llm-operator-edit"] if k.startswith(aggregate)} == {
        aggregate + "edit",
        aggregate + "admin",
    }
    assert not [k for k in labels["rel-llm-operator"] if k.startswith(aggregate)], "the operator's own: no"
    assert not [d for d in render("customized") if d["kind"] == "ClusterRole"], "rbac.aggregatedRoles=false"


def test_admission_policy_is_off_by_default_and_carries_the_values_lists() -> None:
    assert not [d for d in render() if "ValidatingAdmissionPolicy" in d["kind"]]
    docs = render("namespaces")
    policy, binding = one(docs, "ValidatingAdmissionPolicy"), one(docs, "ValidatingAdmissionPolicyBinding")
    variables = {v["name"]: yaml.safe_load(v["expression"]) for v in policy["spec"]["variables"]}
    assert variables == {
        "imagePrefixes": ["registry.example/llm/"], "serviceAccounts": ["llm-serving"],
        "secrets": ["hf-token", "regcred"], "endpoints": ["https://hub-mirror.example"],
        "deniedEnvPrefixes": ["LD_", "PYTHON", "PATH", "LLMOP_", "OMPI_", "OPAL_", "PMIX_", "UCX_", "NCCL_",
                              "TLLM_", "TRTLLM_"],
        "configMaps": [], "priorityClasses": ["llm-serving"], "tolerationKeys": [], "podAnnotations": [],
        "podLabels": [],
    }  # fmt: skip
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Warn", "Audit"],
        "matchResources": {"namespaceSelector": {"matchLabels": {"llm.example/tenant": "true"}}},
    }
    fields = [v["message"].split(" ", 1)[0] for v in policy["spec"]["validations"]]
    assert fields == [
        "spec.runtime.image", "spec.engine.build.image", "spec.runtime.serviceAccountName",
        "spec.runtime.env[].valueFrom.secretKeyRef.name", "spec.runtime.envFrom[].secretRef.name",
        "spec.runtime.imagePullSecrets[].name", "spec.model.source.credentialsSecretRef.name",
        "spec.routing.apiKeys.secretRef.name", "spec.model.source.endpoint", "spec.runtime.env[].name",
        "spec.runtime.envFrom[].prefix",
        "spec.runtime.envFrom[].configMapRef", "spec.placement.priorityClassName",
        "spec.placement.tolerations[].key", "spec.runtime.podAnnotations", "spec.runtime.podLabels",
    ]  # fmt: skip
    enabled = ("--set", "admissionPolicy.enabled=true")
    old = helm("template", "rel", str(CHART), "--kube-version", "1.29.9", *enabled, check=False)
    assert old.returncode != 0 and "needs Kubernetes 1.30 or newer" in old.stderr, old.stderr


def bindings(docs: list[dict[str, Any]]) -> list[tuple[str, str | None, str, list[dict[str, str]]]]:
    return [
        (d["kind"], d["metadata"].get("namespace"), d["roleRef"]["name"], d["subjects"])
        for d in docs
        if d["kind"] in ("ClusterRoleBinding", "RoleBinding")
    ]


def test_bindings_cluster_wide_by_default_and_namespaced_when_watching_one() -> None:
    subject = [{"kind": "ServiceAccount", "name": "rel-llm-operator", "namespace": "ops"}]
    assert sorted(bindings(render())) == [
        ("ClusterRoleBinding", None, "rel-llm-operator", subject),
        ("ClusterRoleBinding", None, "rel-llm-operator-cluster", subject),
        ("RoleBinding", "ops", "rel-llm-operator-leader-election", subject),
    ]
    # Watching namespaces: LLMDeployments and children only there; the cluster-scoped reads stay.
    docs = render("namespaces")
    subject = [{"kind": "ServiceAccount", "name": "ops-operator", "namespace": "ops"}]
    assert sorted(bindings(docs)) == [
        ("ClusterRoleBinding", None, "rel-llm-operator-cluster", subject),
        ("RoleBinding", "ops", "rel-llm-operator-leader-election", subject),
        ("RoleBinding", "team-a", "rel-llm-operator", subject),
        ("RoleBinding", "team-b", "rel-llm-operator", subject),
    ]
    assert not [d for d in docs if d["kind"] == "ServiceAccount"], "serviceAccount.create=false"
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "ops-operator"


# --- values: documented, schema strict ----------------------------------------------------------


def test_every_value_is_documented_and_in_the_schema() -> None:
    """cert-manager style: a `# --` comment on every value; grouping keys only group documented ones."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    stack: list[tuple[int, bool]] = []  # (indent, documented) of the enclosing keys
    undocumented = []
    for i, line in enumerate(lines):
        m = re.match(r"^( *)([A-Za-z][\w.-]*):(.*)$", line)
        if not m:
            continue
        indent, key, rest = len(m.group(1)), m.group(2), m.group(3).strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        j = i - 1
        while j >= 0 and lines[j].strip().startswith("#"):
            j -= 1
        documented = any(lines[k].strip().startswith("# --") for k in range(j + 1, i))
        inherited = any(doc for _, doc in stack)
        if rest and not documented and not inherited:
            undocumented.append(key)
        stack.append((indent, documented or inherited))
    assert not undocumented, f"values.yaml: no `# --` comment on {undocumented}"

    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(node: dict[str, Any], value: Any, path: str) -> None:
        # Groups of values (non-empty maps in values.yaml) must list exactly the schema's keys.
        if value and node.get("type") == "object" and node.get("additionalProperties") is False:
            props = node["properties"]
            assert set(value) == set(props) - {"global"}, f"{path}: values.yaml and the schema differ"
            for key, sub in props.items():
                if key in value:
                    walk(sub, value[key], f"{path}.{key}")

    walk(schema, values, "values")


def test_extra_env_cannot_shadow_what_the_chart_sets() -> None:
    """A variable the chart sets from its values, repeated in operator.extraEnv, would be set twice
    (the later wins in Kubernetes, silently): the schema refuses each, so a new one must join it."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    extra = schema["properties"]["operator"]["properties"]["extraEnv"]["items"]["properties"]["name"]
    refused = re.compile(extra["not"]["pattern"])
    template = (CHART / "templates/deployment.yaml").read_text()
    set_by_chart = set(re.findall(r"- name: (LLMOP_\w+)", template))
    assert len(set_by_chart) > 20, "the template's variables were not found"
    assert {name for name in set_by_chart if not refused.match(name)} == set()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "replicaCount=2"], "additional properties 'replicaCount' not allowed"),
        (["--set", "operator.unknownKey=1"], "additional properties 'unknownKey' not allowed"),
        (["--set", "operator.workers=many"], "/operator/workers"),
        (["--set", "rbac.create=yes"], "/rbac/create"),
        (["--set", "image.pullPolicy=Sometimes"], "/image/pullPolicy"),
        (["--set", "watchNamespaces={a,a}"], "/watchNamespaces"),
        (["--set", "watchNamespaces={Team_A}"], "/watchNamespaces/0"),
        (["--set", "operator.extraEnv[0].name=LLMOP_WORKERS"], "/operator/extraEnv/0/name"),
        (["--set", "metrics.serviceMonitor.interval=often"], "/metrics/serviceMonitor/interval"),
        (["--set", "resources.request.cpu=1"], "additional properties 'request' not allowed"),
        (["--set", "replicas=0"], "/replicas"),
        (["--set", "leaderElection.enabled=yes"], "/leaderElection/enabled"),
        (["--set", "operator.extraEnv[0].name=LLMOP_LEADER_ELECTION"], "/operator/extraEnv/0/name"),
        (["--set", "operator.extraEnv[0].name=LLMOP_LAUNCHER_IMAGE_REPOSITORY"], "/operator/extraEnv/0/name"),
        (["--set", "operator.launcherImage.repository=x/l@sha256:0"], "/operator/launcherImage/repository"),
        (["--set", "operator.prometheusUrl=prometheus:9090"], "/operator/prometheusUrl"),
        (["--set", "operator.analysisPrometheusUrls={http://p?x=}"], "/operator/analysisPrometheusUrls/0"),
        (["--set", "operator.analysisPrometheusUrls={http://u@p}"], "/operator/analysisPrometheusUrls/0"),
        (["--set", "operator.analysisPrometheusUrls={http://p,http://p}"], "analysisPrometheusUrls"),
        (["--set", "monitoring.recordingRules.rateWindow=1 minute"], "/monitoring/recordingRules/rateWindow"),
        (["--set", "admissionPolicy.validationActions={Deny,Warn}"], "/admissionPolicy/validationActions"),
        (["--set", "admissionPolicy.allowedSecretNames={Bad_Name}"], "/admissionPolicy/allowedSecretNames/0"),
        (["--set", "admissionPolicy.allowedImagePrefixs={x}"], "allowedImagePrefixs"),
        (["--set", "admissionPolicy.allowedImagePrefixes={nvcr.io}"], "allowedImagePrefixes/0"),
        (["--set", "admissionPolicy.allowedEndpoints={http://u:p@hub}"], "allowedEndpoints/0"),
        (["--set", "networkPolicy.metricsPeers={10.0.0.0/40}"], "/networkPolicy/metricsPeers/0"),
        # Removed (docs/upgrading.md): multi-node pods run operator.runtimeImage.
        (["--set", "operator.multiNodeRuntimeImage=r/sshd:25.12"], "'multiNodeRuntimeImage' not allowed"),
    ],
    ids=["unknown-top", "unknown-nested", "wrong-type-int", "wrong-type-bool", "enum", "repeated-namespace",
         "bad-namespace", "shadowed-env", "duration", "typo-resources", "no-replicas", "election-bool",
         "shadowed-election", "shadowed-launcher", "launcher-digest", "prometheus-url", "analysis-query",
         "analysis-userinfo", "analysis-repeated",
         "rate-window", "deny-and-warn", "bad-secret-name", "unknown-policy-key", "prefix-without-slash",
         "endpoint-with-credentials", "metrics-peer", "removed-multi-node-image"],
)  # fmt: skip
def test_values_schema_rejects_bad_values(args: list[str], message: str) -> None:
    result = helm("template", "rel", str(CHART), *args, check=False)
    assert result.returncode != 0, f"{args} rendered"
    assert "values don't meet the specifications of the schema" in result.stderr, result.stderr
    assert message in result.stderr, result.stderr


def test_port_clash_is_refused() -> None:
    result = helm("template", "rel", str(CHART), "--set", "healthPort=8000", check=False)
    assert result.returncode != 0 and "metrics.port and healthPort must differ" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "leaderElection.enabled=false"], "replicas > 1 needs leaderElection.enabled"),
        (["--set", "leaderElection.renewDeadlineSeconds=15"], "retryPeriodSeconds < renewDeadlineSeconds"),
        (["--set", "leaderElection.retryPeriodSeconds=10"], "retryPeriodSeconds < renewDeadlineSeconds"),
    ],
)
def test_unsafe_leader_election_settings_are_refused(args: list[str], message: str) -> None:
    result = helm("template", "rel", str(CHART), *args, check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr
    single = helm(
        "template", "rel", str(CHART), "--set", "replicas=1", "--set", "leaderElection.enabled=false"
    )
    assert "coordination.k8s.io" not in single.stdout, "no Lease permissions without leader election"
