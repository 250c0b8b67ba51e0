"""Operator benchmark on the embedded cluster: N LLMDeployments until Ready, against a floor.

Floor: `kubectl apply --server-side` of the very children the operator would render (from
`llm-operator render`) in another namespace, timed until every StatefulSet is ready: the cost of
the cluster itself (API server, StatefulSet controller, scheduler, KWOK). The operator's time over
the floor's, measured side by side in one run, is its overhead. Then the operator is left idle
and its API writes are counted from its own metrics; its peak RSS is read from /proc.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from e2e import operator_release
from e2e.cluster.launcher import Cluster
from e2e.cluster.testing import Kubectl

REPO = Path(__file__).resolve().parents[1]
PRODUCTS = ("NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB", "NVIDIA-L40S")


def bench_nodes(count: int) -> list[dict[str, Any]]:
    """Extra KWOK GPU nodes so N deployments fit (the default pools hold a few dozen GPUs)."""
    nodes = []
    for i in range(count):
        product = PRODUCTS[i % len(PRODUCTS)]
        name = f"bench-gpu-{i:04d}"
        nodes.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {"kwok.x-k8s.io/node": "fake"},
                    "labels": {
                        "kubernetes.io/hostname": name,
                        "type": "kwok-bench",
                        "nvidia.com/gpu.product": product,
                        "nvidia.com/gpu.count": "8",
                        "nvidia.com/gpu.memory": "81559" if "H100" in product else "40960",
                        "nvidia.com/gpu.compute.major": "9" if "H100" in product else "8",
                        "nvidia.com/gpu.compute.minor": "9" if "L40S" in product else "0",
                        "topology.kubernetes.io/zone": f"bench-zone-{i % 3}",
                    },
                },
                "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
                "status": {
                    "allocatable": {"cpu": "96", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8"},
                    "capacity": {"cpu": "96", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8"},
                },
            }
        )
    return nodes


def deployments(n: int) -> list[dict[str, Any]]:
    docs = []
    for i in range(n):
        product = PRODUCTS[i % len(PRODUCTS)]
        docs.append(
            {
                "apiVersion": "llmoperator.io/v1alpha1",
                "kind": "LLMDeployment",
                "metadata": {"name": f"bench-{i:04d}"},
                "spec": {
                    "model": {
                        "name": "meta-llama/Meta-Llama-3-8B-Instruct",
                        "source": {"uri": "s3://m/llama3-8b/"},
                    },
                    "engine": {
                        "precision": "fp16",
                        "maxBatchSize": 8,
                        "maxInputLen": 2048,
                        "maxSeqLen": 4096,
                        "maxNumTokens": 4096,
                        "prebuilt": {"uri": f"pvc://engines/llama3-8b-{i % 3}"},
                    },
                    "parallelism": {"tensor": 1, "pipeline": 1},
                    "resources": {"gpu": {"products": [product]}},
                    "replicas": 1,
                },
            }
        )
    return docs


def wait(what: str, done: Callable[[], bool], timeout: float) -> float:
    start = time.perf_counter()
    while not done():
        if time.perf_counter() - start > timeout:
            raise SystemExit(f"bench: timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(1)
    return time.perf_counter() - start


def statefulsets_ready(kubectl: Kubectl, namespace: str, n: int) -> bool:
    items = kubectl.items("statefulsets", namespace)
    ready = sum(1 for s in items if s.get("status", {}).get("readyReplicas", 0) >= s["spec"]["replicas"])
    return len(items) >= n and ready >= n


def deployments_ready(kubectl: Kubectl, namespace: str, n: int) -> bool:
    items = kubectl.items("llmdeployments", namespace)
    ready = sum(
        1 for d in items
        if any(c["type"] == "Ready" and c["status"] == "True" for c in _conditions(d))
    )  # fmt: skip
    return ready >= n


def _conditions(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return list(obj.get("status", {}).get("conditions", []))


def operator_writes(metrics_port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("llm_operator_api_writes_total{")
    )


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run(
    print_fn: Callable[[str], None] = print, n: int | None = None, idle_seconds: int | None = None
) -> None:
    n = n or int(os.environ.get("BENCH_DEPLOYMENTS", "200"))
    idle = idle_seconds if idle_seconds is not None else int(os.environ.get("BENCH_IDLE_SECONDS", "120"))
    cluster = Cluster()
    cluster.up()
    if operator_release.uninstall(cluster):
        print_fn("operator bench: uninstalled the operator `make operator-up` installed")
    kubectl = Kubectl(cluster.kubeconfig, cluster.state_dir / "bin" / "kubectl", timeout=300)
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    kubectl("wait", "--for=condition=Established", "crd/llmdeployments.llmoperator.io", "--timeout=30s")
    kubectl.apply(bench_nodes(n // 4 + 3))  # floor and operator pods run side by side
    for ns in ("bench-floor", "bench-operator"):
        kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=true")
        kubectl("delete", "pv", f"{ns}-engines", "--ignore-not-found")  # bound to the old claim
        kubectl("create", "namespace", ns)
        kubectl.apply(
            [
                {"apiVersion": "v1", "kind": "PersistentVolume",
                 "metadata": {"name": f"{ns}-engines"},
                 "spec": {"capacity": {"storage": "1Ti"}, "accessModes": ["ReadWriteMany"],
                          "storageClassName": "",
                          "hostPath": {"path": "/tmp/engines"},
                          "claimRef": {"namespace": ns, "name": "engines"}}},
                {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                 "metadata": {"name": "engines", "namespace": ns},
                 "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "",
                          "volumeName": f"{ns}-engines",
                          "resources": {"requests": {"storage": "1Ti"}}}},
            ]
        )  # fmt: skip
    docs = deployments(n)
    manifest = yaml.safe_dump_all(docs)

    # Floor: the same children, rendered offline, applied in one go.
    rendered = subprocess.run(
        [sys.executable, "-m", "llm_operator.cli", "render", "-f", "-"],
        input=manifest.replace("namespace: default", ""),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    children = [d for d in yaml.safe_load_all(rendered) if d]
    for child in children:
        child["metadata"]["namespace"] = "bench-floor"
        child["metadata"].pop("ownerReferences", None)
    start = time.perf_counter()
    kubectl(
        "apply",
        "--server-side",
        "-f",
        "-",
        namespace="bench-floor",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": children}),
    )
    floor = time.perf_counter() - start
    floor += wait("floor StatefulSets ready", lambda: statefulsets_ready(kubectl, "bench-floor", n), 1800)
    print_fn(
        f"operator bench: floor (kubectl apply --server-side of {len(children)} rendered children): "
        f"{floor:.1f} s"
    )

    metrics_port = 18900
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "LLMOP_METRICS_PORT": str(metrics_port),
        "LLMOP_HEALTH_PORT": "18901",
        "LLMOP_LOG_LEVEL": "WARNING",
    }
    log = (cluster.state_dir / "logs" / "operator-bench.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "llm_operator.cli", "run", "--namespace", "bench-operator"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait("operator metrics", lambda: _up(metrics_port), 60)
        start = time.perf_counter()
        kubectl("apply", "--server-side", "-f", "-", namespace="bench-operator", input=manifest)
        elapsed = time.perf_counter() - start
        elapsed += wait(
            "all LLMDeployments Ready", lambda: deployments_ready(kubectl, "bench-operator", n), 1800
        )
        print_fn(f"operator bench: {n} LLMDeployments Ready in {elapsed:.1f} s")
        print_fn(f"operator bench: ratio operator/floor = {elapsed / floor:.2f} (goal <= 1.25)")
        time.sleep(10)  # let the last status writes and child events settle
        before = operator_writes(metrics_port)
        time.sleep(idle)
        after = operator_writes(metrics_port)
        print_fn(f"operator bench: API writes during {idle} s idle = {after - before:.0f} (goal 0)")
        print_fn(f"operator bench: operator peak RSS = {peak_rss_mib(proc.pid):.0f} MiB (goal <= 200 at 500)")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for ns in ("bench-floor", "bench-operator"):
            kubectl("delete", "namespace", ns, "--wait=false")
        kubectl("delete", "nodes", "-l", "type=kwok-bench", "--wait=false")
        kubectl("delete", "pv", "bench-floor-engines", "bench-operator-engines", "--ignore-not-found")


def _up(port: int) -> bool:
    try:
        operator_writes(port)
        return True
    except OSError:
        return False


if __name__ == "__main__":
    run()
