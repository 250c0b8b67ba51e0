"""The chart against a real API server: `helm install` passes the restricted Pod Security admission
and the operator pod runs (on the embedded cluster's real node, from the locally built operator
image imported at `up`); the
ServiceAccount's RBAC is enough for the operator to serve an LLMDeployment, and no more; `helm
uninstall` removes everything but the CRD.

Release names are unique: the chart's ClusterRoles and bindings are cluster-scoped. The CRD is
cluster-scoped too and shared with the other e2e tests: the session's `crd` fixture installs it, and
Helm skips a CRD from crds/ that already exists (what users see on a re-install).
"""

from __future__ import annotations

import functools
import os
import re
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator.inject import content_tag

from e2e.cluster.processes import free_port
from e2e.cluster.testing import E2ECluster, Kubectl, is_true, pod_ready, wait_for
from e2e.operator_env import CPU_RUNTIME_IMAGE
from tests.e2e import manifests
from tests.unit.test_chart import CHART, HELM

pytestmark = [pytest.mark.e2e, pytest.mark.exclusive]  # the chart's operator watches every namespace

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 120
# Built by images.builder and imported into the embedded cluster's real node at `up` (`:dev`:
# imagePullPolicy IfNotPresent finds them there, nothing is pulled).
LOCAL_IMAGES = ["--set", "image.repository=localhost/llm-operator/operator", "--set", "image.tag=dev",
                "--set", f"operator.cpuRuntimeImage={CPU_RUNTIME_IMAGE}"]  # fmt: skip


class Helm:
    def __init__(self, cluster: E2ECluster) -> None:
        linked = cluster.launcher.bin_dir / "helm" if cluster.launcher is not None else None
        binary = str(linked) if linked is not None and linked.exists() else HELM
        if binary is None:
            pytest.fail("helm not found: run `make tools`", pytrace=False)
        self.argv = [binary, f"--kubeconfig={cluster.kubeconfig}"]
        # The embedded cluster runs the local images; another cluster the chart's own.
        self.images = LOCAL_IMAGES if cluster.launcher is not None else []

    def __call__(self, *args: str) -> str:
        result = subprocess.run([*self.argv, *args], capture_output=True, text=True, timeout=TIMEOUT + 60)
        assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
        return result.stdout


@pytest.fixture
def release(crd: None, cluster: E2ECluster, kubectl: Kubectl, namespace: str) -> Iterator[tuple[Helm, str]]:
    """A unique release name in the test's namespace; uninstalled afterwards whatever happened."""
    helm, name = Helm(cluster), f"llmop-{secrets.token_hex(3)}"
    yield helm, name
    subprocess.run([*helm.argv, "uninstall", name, "--namespace", namespace, "--ignore-not-found"],
                   capture_output=True, timeout=TIMEOUT)  # fmt: skip


def can_i(
    kubectl: Kubectl, sa: str, verb: str, resource: str, namespace: str | None = None, subresource: str = ""
) -> bool:
    """`resource` is kubectl's TYPE or TYPE/NAME; a subresource (pods' log) goes in `subresource`."""
    where = [f"--namespace={namespace}"] if namespace else ["--all-namespaces"]
    sub = [f"--subresource={subresource}"] if subresource else []
    result = kubectl("auth", "can-i", verb, resource, *sub, f"--as={sa}", *where, check=False)
    return result.stdout.strip() == "yes"


def test_helm_install_restricted_operator_and_uninstall(
    release: tuple[Helm, str], kubectl: Kubectl, namespace: str
) -> None:
    helm, name = release
    # The API server itself enforces the restricted Pod Security Standard on this namespace.
    kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted",
            "pod-security.kubernetes.io/enforce-version=latest")  # fmt: skip
    started = time.monotonic()
    out = helm("install", name, str(CHART), "--namespace", namespace, *helm.images,
               "--wait", f"--timeout={TIMEOUT}s")  # fmt: skip
    assert "STATUS: deployed" in out and "kubectl apply --server-side" in out, out  # NOTES.txt
    took = time.monotonic() - started

    pods = kubectl.items("pods", namespace, f"app.kubernetes.io/instance={name}")
    assert len(pods) == 2, "a leader and a standby"
    for pod in pods:
        assert pod_ready(pod), pod["status"]
        assert pod["spec"]["serviceAccountName"] == f"{name}-llm-operator"
        node = kubectl.get("node", pod["spec"]["nodeName"])
        assert node is not None and not node["spec"].get("taints"), "the operator needs no GPU node"
    deployment = kubectl.get("deployment", f"{name}-llm-operator", namespace)
    assert deployment is not None and deployment["status"]["availableReplicas"] == 2
    policy = kubectl.get("networkpolicy", f"{name}-llm-operator", namespace)
    assert policy is not None, "the API server takes the operator pods' NetworkPolicy"
    assert policy["spec"]["ingress"][0]["ports"] == [{"port": "metrics", "protocol": "TCP"}]

    # RBAC as the API server sees it: what the operator needs, cluster-wide; nothing it does not.
    sa = f"system:serviceaccount:{namespace}:{name}-llm-operator"
    for verb, resource in [("patch", "statefulsets.apps"), ("delete", "pods"), ("list", "nodes"),
                           ("patch", "llmdeployments.llmoperator.io/status"), ("create", "events"),
                           ("create", "secrets"), ("watch", "events"),
                           ("watch", "customresourcedefinitions.apiextensions.k8s.io"),
                           # routing.mode inference-pool: the router and the picker's own Role
                           ("patch", "deployments.apps"), ("create", "roles.rbac.authorization.k8s.io"),
                           ("patch", "inferencepools.inference.networking.k8s.io")]:  # fmt: skip
        assert can_i(kubectl, sa, verb, resource), (verb, resource)
    for verb, resource in [("get", "secrets"), ("list", "secrets"), ("delete", "secrets"),
                           ("update", "llmdeployments.llmoperator.io"),
                           ("delete", "nodes"), ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
                           ("update", "deployments.apps"), ("update", "statefulsets.apps"),
                           ("update", "llmdeployments.llmoperator.io/status"),
                           ("create", "events.events.k8s.io"), ("list", "namespaces"),
                           ("escalate", "roles.rbac.authorization.k8s.io"),
                           ("bind", "roles.rbac.authorization.k8s.io"),
                           ("update", "pods")]:  # fmt: skip
        assert not can_i(kubectl, sa, verb, resource), (verb, resource)
    # It reads no pod's log (a model fetch's progress stays in its own log) and never execs.
    assert not can_i(kubectl, sa, "get", "pods", subresource="log")
    assert not can_i(kubectl, sa, "create", "pods", subresource="exec")
    # The roles for people: Kubernetes aggregates them into its built-in view, edit and admin.
    for role, verb in [("view", "watch"), ("edit", "create"), ("admin", "deletecollection")]:
        wait_for(f"llmdeployments {verb} aggregated into ClusterRole {role}",
                 functools.partial(kubectl.get, "clusterrole", role),
                 functools.partial(grants_llmdeployments, verb), timeout=30)  # fmt: skip
    # Leader election: its own Lease, in its own namespace only.
    lease = f"leases.coordination.k8s.io/{name}-llm-operator"
    assert can_i(kubectl, sa, "update", lease, namespace)
    assert can_i(kubectl, sa, "create", "leases", namespace)
    assert not can_i(kubectl, sa, "update", "leases.coordination.k8s.io/other", namespace)
    assert not can_i(kubectl, sa, "update", lease, "default") and not can_i(kubectl, sa, "create", "leases")
    if helm.images:  # the leader pod itself serves a deployment (on the real node, in-cluster)
        held = wait_for("the Lease held", lambda: kubectl.get("lease", f"{name}-llm-operator", namespace),
                        lambda o: bool(o and o["spec"].get("holderIdentity")), timeout=TIMEOUT)  # fmt: skip
        # In the restricted namespace: the serving pods pass the API server's Pod Security too.
        serve_from_the_pod(kubectl, namespace, namespace, held["spec"]["holderIdentity"])  # type: ignore[index]

    helm("uninstall", name, "--namespace", namespace, "--wait", f"--timeout={TIMEOUT}s")
    gone = [("clusterrole", "-llm-operator"), ("clusterrole", "-llm-operator-cluster"),
            ("clusterrole", "-llm-operator-view"), ("clusterrole", "-llm-operator-edit"),
            ("clusterrolebinding", "-llm-operator"), ("serviceaccount", "-llm-operator"),
            ("role", "-llm-operator-leader-election"),
            ("rolebinding", "-llm-operator-leader-election"), ("networkpolicy", "-llm-operator")]  # fmt: skip
    for kind, suffix in gone:
        namespaced = kind in ("serviceaccount", "role", "rolebinding", "networkpolicy")
        obj = kubectl.get(kind, name + suffix, namespace if namespaced else None)
        assert obj is None, (kind, name + suffix)
    assert kubectl.get("crd", "llmdeployments.llmoperator.io") is not None, "Helm never deletes crds/"
    print(f"helm install --wait of {name}: {took:.1f} s")


def grants_llmdeployments(verb: str, role: dict[str, Any] | None) -> bool:
    rules = (role or {}).get("rules") or []
    return any("llmdeployments" in r.get("resources", []) and verb in r["verbs"] for r in rules)


def statefulset_applies(kubectl: Kubectl, namespace: str, pod: str) -> float:
    """The pod's own count of StatefulSet applies, from its metrics through the API server."""
    text = kubectl("get", "--raw", f"/api/v1/namespaces/{namespace}/pods/{pod}:8000/proxy/metrics").stdout
    found = re.search(r'^llm_operator_api_writes_total\{kind="StatefulSet",verb="apply"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def serve_from_the_pod(kubectl: Kubectl, namespace: str, operator_namespace: str, pod: str) -> None:
    """The chart's leader pod, with the chart's RBAC and the in-cluster config, applies a
    cpu-reference deployment's children (its own metrics count the apply; no other operator runs
    during this module) and is refused nothing."""
    before = statefulset_applies(kubectl, operator_namespace, pod)
    manifest: dict[str, Any] = yaml.safe_load((REPO / "examples" / "cpu-reference.yaml").read_text())
    manifest["spec"]["resources"]["cpu"] = "250m"
    kubectl.apply(manifest, namespace=namespace)
    wait_for("LLMDeployment tiny-llama Ready", lambda: kubectl.get("llmdeployment", "tiny-llama", namespace),
             lambda o: is_true(o, "Ready"), timeout=TIMEOUT)  # fmt: skip
    assert statefulset_applies(kubectl, operator_namespace, pod) > before, "the leader pod applied it"
    # Its serving pods copied the launcher from the launcher image beside the chart's operator image,
    # tagged with the content hash of the files it copies.
    operator_image = kubectl.get("pod", pod, operator_namespace)["spec"]["containers"][0]["image"]  # type: ignore[index]
    launcher = f"{operator_image.rpartition('/')[0]}/launcher:{content_tag()}"
    serving = kubectl.items("pods", namespace, "llmoperator.io/deployment=tiny-llama")
    assert serving and all(p["spec"]["initContainers"][0]["image"] == launcher for p in serving)
    log = kubectl("logs", pod, namespace=operator_namespace).stdout
    # RBAC's refusal (not a namespace of another test refusing writes while it terminates).
    refused = re.search(r'.*forbidden: User "system:serviceaccount:.*', log)
    assert refused is None, refused.group(0)
    kubectl("delete", "llmdeployment", "tiny-llama", "--wait=true", namespace=namespace)


def token_kubeconfig(admin: Path, token: str, path: Path) -> Path:
    """The admin kubeconfig's cluster with a ServiceAccount token as the only credential."""
    config = yaml.safe_load(admin.read_text())
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])["context"]
    cluster = next(c for c in config["clusters"] if c["name"] == context["cluster"])
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [cluster],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": cluster["name"], "user": "sa"}}],
    }))  # fmt: skip
    return path


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return str(r.read().decode())


def test_operator_serves_with_only_the_charts_rbac(
    release: tuple[Helm, str], cluster: E2ECluster, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    """Runs the chart's container command, args and env as a local process with the chart's
    ServiceAccount token (its log and metrics at hand; the chart's own pod is scaled to 0 once
    Ready, so one operator serves), watching this namespace and a second one only: the RoleBinding
    path."""
    helm, name = release
    second = kubectl.create_namespace("second")
    try:
        serve_two_namespaces(helm, name, cluster, kubectl, (namespace, second), tmp_path)
    finally:
        kubectl("delete", "namespace", second, "--wait=false")


def serve_two_namespaces(
    helm: Helm, name: str, cluster: E2ECluster, kubectl: Kubectl, watched: tuple[str, str], tmp_path: Path
) -> None:
    namespace, second = watched
    helm("install", name, str(CHART), "--namespace", namespace,
         "--set", f"watchNamespaces={{{namespace},{second}}}",
         "--set", "operator.workers=2", *helm.images, "--wait", f"--timeout={TIMEOUT}s")  # fmt: skip
    deployment = kubectl.get("deployment", f"{name}-llm-operator", namespace)
    assert deployment is not None
    kubectl("scale", "deployment", f"{name}-llm-operator", "--replicas=0", namespace=namespace)
    wait_for("the chart's operator pod gone",
             lambda: kubectl.items("pods", namespace, f"app.kubernetes.io/instance={name}"),
             lambda pods: pods == [], timeout=TIMEOUT)  # fmt: skip
    pod_spec = deployment["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    assert container["command"] == ["llm-operator"]
    assert container["args"] == ["run", "--namespace", namespace, "--namespace", second]
    token = kubectl("create", "token", pod_spec["serviceAccountName"], "--duration=20m", namespace=namespace)
    kubeconfig = token_kubeconfig(cluster.kubeconfig, token.stdout.strip(), tmp_path / "sa.kubeconfig")

    health, metrics = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMOP_")}
    env |= {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env |= {
        "KUBECONFIG": str(kubeconfig),
        "LLMOP_HEALTH_PORT": str(health),
        "LLMOP_METRICS_PORT": str(metrics),
    }
    log_path = tmp_path / "operator.log"
    with log_path.open("w") as log:  # `llm-operator` is the console script of llm_operator.cli:main
        proc = subprocess.Popen([sys.executable, "-m", "llm_operator.cli", *container["args"]],
                                env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)  # fmt: skip
    try:

        def healthy() -> bool:
            assert proc.poll() is None, f"operator exited {proc.returncode}:\n{log_path.read_text()[-3000:]}"
            with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=2) as r:
                return bool(r.status == 200)

        wait_for("the operator's /healthz under the chart's ServiceAccount", healthy, timeout=60)
        manifest: dict[str, Any] = yaml.safe_load((REPO / "examples" / "cpu-reference.yaml").read_text())
        # Two serving pods at once on the real node's 2 CPUs, beside whatever other tests left.
        manifest["spec"]["resources"]["cpu"] = "250m"
        for ns in watched:
            kubectl.apply(manifest, namespace=ns)

        def refused_or_deployment(ns: str) -> dict[str, Any] | None:
            refused = re.search(r".*forbidden.*", log_path.read_text(), re.I)
            assert refused is None, f"the operator was refused: {refused.group(0)[:1500]}"
            return kubectl.get("llmdeployment", "tiny-llama", ns)

        # Every deployment's admin-key Secret, and a multi-node group's SSH Secret, are made with
        # secrets/create alone.
        if cluster.gpu_nodes():
            manifests.engines_claim(kubectl, second)
            group = manifests.deployment("group", parallelism={"tensor": 4, "pipeline": 2},
                                         resources={"gpu": {"products": ["NVIDIA-GB200"]}})  # fmt: skip
            kubectl.apply(group, namespace=second)
        for ns in watched:
            wait_for(f"LLMDeployment tiny-llama Ready in {ns}", functools.partial(refused_or_deployment, ns),
                     lambda o: is_true(o, "Ready"), timeout=TIMEOUT)  # fmt: skip
        if cluster.gpu_nodes():
            ready = wait_for("LLMDeployment group Ready",
                             lambda: kubectl.get("llmdeployment", "group", second),
                             lambda o: is_true(o, "Ready"), timeout=TIMEOUT)  # fmt: skip
            assert ready is not None
            made = kubectl.items("secrets", second, "app.kubernetes.io/instance=group")
            assert sorted(s["metadata"]["labels"]["app.kubernetes.io/component"] for s in made) == [
                "admin-key",
                "launch-identity",
            ]
            assert {s["metadata"]["ownerReferences"][0]["uid"] for s in made} == {ready["metadata"]["uid"]}
        text = wait_for(
            "the operator's own StatefulSet apply in its metrics",
            lambda: scrape(metrics),
            lambda t: re.search(r'api_writes_total\{kind="StatefulSet",verb="apply"\} [1-9]', t) is not None,
            timeout=30,
        )
        assert 'reason="Api403"' not in text, text
        sa = f"system:serviceaccount:{namespace}:{pod_spec['serviceAccountName']}"
        assert can_i(kubectl, sa, "patch", "statefulsets.apps", namespace)
        assert can_i(kubectl, sa, "patch", "statefulsets.apps", second)
        assert not can_i(kubectl, sa, "patch", "statefulsets.apps", "default"), "bound in its namespaces only"
        assert can_i(kubectl, sa, "list", "nodes")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    log_text = log_path.read_text()
    assert not re.search(r"forbidden", log_text, re.I), log_text[-5000:]
