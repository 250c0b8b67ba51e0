"""`make operator-up`: the operator installed into the running embedded cluster from the Helm chart,
as users install it, with the images built here (images.builder) instead of a registry's.

The operator then runs as a pod on the real node, under the chart's ServiceAccount and RBAC, in a
namespace that enforces the restricted Pod Security Standard. The images are named by their
content-addressed tags (`:dev-<inputs hash>`), so a rebuilt image rolls the operator pod and the
cpu-reference serving pods; one missing on the node is pushed to the test registry and pulled
first. The CRD is applied server-side before Helm runs (Helm installs crds/ once and never
upgrades it, docs/helm.md).

CLI: `python -m e2e.operator_release up|down`; `make cluster-down` removes it with the cluster,
and a test session or the bench uninstalls it first (they run their own operator).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.cluster import netns
from e2e.cluster.containerd_images import image_names
from e2e.cluster.launcher import Cluster
from e2e.cluster.pki import NODE_NAME
from e2e.cluster.readiness import ClusterError
from images.builder.images import build

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "llm-operator"
RELEASE = "llm-operator"
NAMESPACE = "llm-operator-system"
SELECTOR = f"app.kubernetes.io/instance={RELEASE}"
# A container waiting for one of these needs a person, not more time.
STUCK = {"CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff", "InvalidImageName",
         "CreateContainerConfigError", "CreateContainerError", "RunContainerError"}  # fmt: skip
LOG_LINES = 20

Log = Callable[[str], None]


@dataclass(frozen=True)
class Installed:
    pods: list[str]
    operator_image: str
    cpu_runtime_image: str
    seconds: float


class Tools:
    """kubectl and helm of the embedded cluster, bound to its admin kubeconfig."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.kubeconfig = f"--kubeconfig={cluster.kubeconfig}"

    def call(self, tool: str, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        argv = [str(self.cluster.bin_dir / tool), self.kubeconfig, *args]
        return subprocess.run(argv, input=input, capture_output=True, text=True, timeout=300)

    def run(self, tool: str, *args: str, input: str | None = None) -> str:
        proc = self.call(tool, *args, input=input)
        if proc.returncode != 0:
            raise ClusterError(f"{tool} {' '.join(args)} failed: {(proc.stderr or proc.stdout).strip()}")
        return proc.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.run("kubectl", *args, "-o", "json"))


def _image(cluster: Cluster, tools: Tools, name: str, log: Log) -> str:
    """images.builder's `name` (built if its inputs changed), pushed to the test registry and
    pulled by the real node unless the kubelet already reports it; its content-addressed
    reference."""
    archive = build(name, log=log)
    ref = next(n for n in image_names(archive) if not n.endswith(":dev"))
    node = tools.json("get", "node", NODE_NAME)
    if not any(ref in i.get("names", []) for i in node["status"].get("images", [])):
        log(f"  pushing {archive.name} and pulling it on {NODE_NAME}")
        cluster.import_image(archive)
    return ref


def install(cluster: Cluster, timeout: float = 180.0, log: Log = print) -> Installed:
    """Install or upgrade the release and wait until every operator pod of the current revision is
    Ready and answers /healthz; ClusterError naming the pod, its state and its last log lines if
    not."""
    if not cluster.status()["apiserver_ready"]:
        raise ClusterError(f"no cluster running in {cluster.state_dir}: run `make cluster-up` first")
    tools = Tools(cluster)
    operator_image = _image(cluster, tools, "operator", log)
    cpu_runtime_image = _image(cluster, tools, "cpu-runtime", log)
    # Its serving pods' init container: beside the operator image (the chart's default), under the
    # content tag the operator names it by.
    _image(cluster, tools, "launcher", log)
    start = time.monotonic()
    tools.run("kubectl", "apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest"}}}  # fmt: skip
    tools.run("kubectl", "apply", "--server-side", "-f", "-", input=json.dumps(namespace))
    repository, tag = operator_image.rsplit(":", 1)
    tools.run("helm", "upgrade", "--install", RELEASE, str(CHART), "--namespace", NAMESPACE,
              "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
              "--set", f"operator.cpuRuntimeImage={cpu_runtime_image}")  # fmt: skip
    pods = _wait_rolled_out(tools, start + timeout)
    return Installed(pods, operator_image, cpu_runtime_image, time.monotonic() - start)


def _wait_rolled_out(tools: Tools, deadline: float) -> list[str]:
    """Names of the Deployment's pods once its current revision is rolled out, Ready and healthy."""
    name = RELEASE
    while True:
        deployment = tools.json("get", "deployment", name, "-n", NAMESPACE)
        pods = [p for p in tools.json("get", "pods", "-n", NAMESPACE, "-l", SELECTOR)["items"]
                if not p["metadata"].get("deletionTimestamp")]  # fmt: skip
        stuck = [(p, why) for p in pods if (why := _stuck(p))]
        if stuck:
            raise ClusterError(_explain(tools, *stuck[0]))
        if _rolled_out(deployment) and all(_healthy(tools, p) for p in pods):
            return [p["metadata"]["name"] for p in pods]
        if time.monotonic() > deadline:
            late = next((p for p in pods if not _ready(p)), pods[0] if pods else None)
            if late is None:
                raise ClusterError(f"deployment {NAMESPACE}/{name} made no pod: {deployment.get('status')}")
            raise ClusterError(_explain(tools, late, "not Ready in time"))
        time.sleep(1)


def _rolled_out(deployment: dict[str, Any]) -> bool:
    st, want = deployment.get("status") or {}, deployment["spec"].get("replicas", 1)
    return bool(
        st.get("observedGeneration") == deployment["metadata"]["generation"]
        and st.get("updatedReplicas", 0) == st.get("replicas", 0) == st.get("readyReplicas", 0) == want
    )


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _healthy(tools: Tools, pod: dict[str, Any]) -> bool:
    """Ready (the chart has no readiness probe: the container runs) and the operator's /healthz answers,
    asked through the API server's pod proxy (inside the cluster's network)."""
    if not _ready(pod):
        return False
    port = next(p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])
                if p["name"] == "health")  # fmt: skip
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}:{port}/proxy/healthz"
    return tools.call("kubectl", "get", "--raw", path).returncode == 0


def _stuck(pod: dict[str, Any]) -> str | None:
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (c.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK:
            return f"{waiting['reason']}: {waiting.get('message', '')}".rstrip(": ")
    return None


def _explain(tools: Tools, pod: dict[str, Any], why: str) -> str:
    name = pod["metadata"]["name"]
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    restarted = any(c.get("restartCount", 0) for c in statuses)
    args = ["logs", name, "-n", NAMESPACE, f"--tail={LOG_LINES}", *(["--previous"] if restarted else [])]
    logs = tools.call("kubectl", *args).stdout.strip() or "(no log)"
    tail = "\n".join(f"    {line}" for line in logs.splitlines())
    return (f"operator pod {NAMESPACE}/{name} is not ready: {why}\n  its last log lines"
            f"{' (previous container)' if restarted else ''}:\n{tail}")  # fmt: skip


def uninstall(cluster: Cluster, timeout: float = 120.0) -> bool:
    """Remove the release and wait until its pods are gone (no second operator may act beside a
    test session's); True if it was installed."""
    if not cluster.kubeconfig.exists() or not netns.exists(cluster.netns):
        return False
    tools = Tools(cluster)
    listed = tools.run("helm", "list", "--namespace", NAMESPACE, "--filter", f"^{RELEASE}$", "-q")
    if not listed.strip():
        return False
    tools.run("helm", "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", f"--timeout={timeout:.0f}s")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.operator_release", description=__doc__.split(".")[0])
    parser.add_argument("command", choices=("up", "down"))
    args = parser.parse_args(argv)
    cluster = Cluster()
    try:
        if args.command == "up":
            done = install(cluster)
            print(f"operator {', '.join(done.pods)} Ready in {done.seconds:.1f} s (namespace {NAMESPACE}, "
                  f"release {RELEASE}, image {done.operator_image})")  # fmt: skip
            print(f"cpu-reference serving pods run {done.cpu_runtime_image}")
        else:
            print("operator uninstalled" if uninstall(cluster) else "operator was not installed")
    except ClusterError as e:
        print(f"operator {args.command} failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
