"""Operator benchmark on the embedded cluster: the load curve of N LLMDeployments until Ready,
each size against its floor.

Floor: `kubectl apply --server-side` of the very children the operator would render (from
`llm-operator render`) in another namespace, by as many kubectl processes at once as the operator
keeps applies in flight, timed until every StatefulSet is ready: the cost of
the cluster itself (API server, StatefulSet controller, scheduler, KWOK). The operator's time over
the floor's, measured one after the other in one run on the same cluster, is its overhead. Then
the operator is left idle and its API writes are counted from its own metrics; its peak RSS is
read from /proc (a fresh operator process per size). Then it is killed and started again: how long
the new process takes to reconcile every deployment once, and what it writes doing so (a restart
or a new leader). At one size, P4: spec edit to child updated.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from lightkube import Client, KubeConfig
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.types import PatchType
from llm_operator import labels as L
from llm_operator.controller.cluster.apply import APPLIES_IN_FLIGHT
from llm_operator.manifests import MAX_MANIFEST_OBJECTS

from e2e import operator_release
from e2e.cluster.launcher import Cluster
from e2e.cluster.processes import free_port
from e2e.cluster.testing import Kubectl

REPO = Path(__file__).resolve().parents[1]
LLMDeploymentResource = create_namespaced_resource(
    "llmoperator.io", "v1alpha1", "LLMDeployment", "llmdeployments"
)
# The operator keeps at most this many applies in flight, across its reconcile workers. The floor
# gets as many kubectl clients, so the operator's concurrency is no advantage over it.
FLOOR_CLIENTS = APPLIES_IN_FLIGHT
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
                        "source": {"uri": "pvc://engines/models/llama3-8b"},
                    },
                    "engine": {
                        "backend": "tensorrt-engine",
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


def _metric(metrics_port: int, prefix: str) -> float:
    """Sum of the operator's samples whose line starts with `prefix`."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def operator_writes(metrics_port: int) -> float:
    return _metric(metrics_port, "llm_operator_api_writes_total{")


def reconciles(metrics_port: int) -> float:
    return _metric(metrics_port, "llm_operator_reconcile_duration_seconds_count")


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Restart:
    seconds: float  # from the new process's start until every deployment was reconciled once
    writes: float


@dataclass
class Row:
    n: int
    floor_s: float
    operator_s: float
    idle_writes: float
    rss_mib: float
    restart: Restart
    edit_p99_s: float | None = None

    @property
    def ratio(self) -> float:
        return self.operator_s / self.floor_s


GOALS = "goals: ratio <= 1.10 at every size, RSS <= 200 MiB at 2000, 0 idle writes, P4 p99 <= 1 s at 1000"


def run(
    print_fn: Callable[[str], None] = print,
    sizes: Sequence[int] | None = None,
    idle_seconds: int | None = None,
    edits_at: int = 1000,
) -> None:
    """The load curve: each size converged by the operator and by the kubectl floor in the same
    run, then 2 idle minutes, then (at `edits_at`) the spec-edit-to-child latency P4."""
    sizes = sizes or [int(s) for s in os.environ.get("BENCH_SIZES", "100,500,1000,2000").split(",")]
    idle = idle_seconds if idle_seconds is not None else int(os.environ.get("BENCH_IDLE_SECONDS", "120"))
    cluster = Cluster()
    cluster.up()
    if operator_release.uninstall(cluster):
        print_fn("operator bench: uninstalled the operator `make operator-up` installed")
    # One `kubectl apply` of the floor sends its objects one after the other: about 60 ms each here,
    # so 10,000 children at N=2000 take longer than 10 minutes.
    kubectl = Kubectl(cluster.kubeconfig, cluster.state_dir / "bin" / "kubectl", timeout=3600)
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    kubectl("wait", "--for=condition=Established", "crd/llmdeployments.llmoperator.io", "--timeout=30s")
    kubectl.apply(bench_nodes(max(sizes) // 4 + 3))  # floor and operator pods run side by side
    rows = []
    try:
        for n in sizes:
            row = measure(cluster, kubectl, n, idle, edit_latency=n == edits_at, print_fn=print_fn)
            rows.append(row)
            print_fn(f"operator bench: {_line(row)}")
    finally:
        kubectl("delete", "nodes", "-l", "type=kwok-bench", "--wait=false")
    print_fn("operator bench: load curve (" + GOALS + ")")
    print_fn("  " + _HEADER)
    for row in rows:
        print_fn("  " + _line(row))


_HEADER = (
    f"{'N':>5}  {'floor s':>8}  {'operator s':>10}  {'ratio':>5}  {'idle writes':>11}  {'RSS MiB':>7}  "
    f"{'restart s':>9}  {'writes':>6}  P4 p99"
)


def _line(row: Row) -> str:
    p4 = f"{row.edit_p99_s * 1000:.0f} ms" if row.edit_p99_s is not None else "-"
    return (
        f"{row.n:>5}  {row.floor_s:>8.1f}  {row.operator_s:>10.1f}  {row.ratio:>5.2f}  "
        f"{row.idle_writes:>11.0f}  {row.rss_mib:>7.0f}  {row.restart.seconds:>9.1f}  "
        f"{row.restart.writes:>6.0f}  {p4}"
    )


def measure(
    cluster: Cluster,
    kubectl: Kubectl,
    n: int,
    idle: int,
    *,
    edit_latency: bool,
    print_fn: Callable[[str], None],
) -> Row:
    floor_ns, operator_ns = f"bench-floor-{n}", f"bench-operator-{n}"
    for ns in (floor_ns, operator_ns):
        _fresh_namespace(kubectl, ns)
    docs = deployments(n)

    # Floor: the same children, rendered offline, applied by as many kubectl processes at once as
    # the operator keeps applies in flight (one kubectl sends its objects one after the other).
    # `render` takes at most MAX_MANIFEST_OBJECTS per file.
    rendered = [
        subprocess.run(
            [sys.executable, "-m", "llm_operator.cli", "render", "-f", "-"],
            input=yaml.safe_dump_all(docs[i : i + MAX_MANIFEST_OBJECTS]),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for i in range(0, len(docs), MAX_MANIFEST_OBJECTS)
    ]
    children = [d for text in rendered for d in yaml.safe_load_all(text) if d]
    for child in children:
        child["metadata"]["namespace"] = floor_ns
        child["metadata"].pop("ownerReferences", None)
    start = time.perf_counter()
    apply_in_parallel(kubectl, children, floor_ns)
    floor = time.perf_counter() - start
    floor += wait("floor StatefulSets ready", lambda: statefulsets_ready(kubectl, floor_ns, n), 3600)
    kubectl("delete", "namespace", floor_ns, "--wait=true")  # the operator's run gets the cluster alone

    metrics_port = free_port()
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "LLMOP_METRICS_PORT": str(metrics_port),
        "LLMOP_HEALTH_PORT": str(free_port()),
        "LLMOP_LOG_LEVEL": "WARNING",
    }
    log = (cluster.state_dir / "logs" / f"operator-bench-{n}.log").open("w")

    def operator() -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "llm_operator.cli", "run", "--namespace", operator_ns]
        return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)

    proc = operator()
    try:
        wait("operator metrics", lambda: _up(metrics_port), 60)
        start = time.perf_counter()
        apply_in_parallel(kubectl, docs, operator_ns)
        elapsed = time.perf_counter() - start
        elapsed += wait("all LLMDeployments Ready", lambda: deployments_ready(kubectl, operator_ns, n), 3600)
        time.sleep(10)  # let the last status writes and child events settle
        before = operator_writes(metrics_port)
        time.sleep(idle)
        writes = operator_writes(metrics_port) - before
        rss = peak_rss_mib(proc.pid)

        # A restart (or a new leader) over N converged deployments: until each is reconciled once.
        proc.kill()
        proc.wait()
        proc, restarted = operator(), time.perf_counter()
        wait("the restarted operator's metrics", lambda: _up(metrics_port), 60)
        wait("every deployment reconciled after the restart", lambda: reconciles(metrics_port) >= n, 600)
        restart = Restart(time.perf_counter() - restarted, operator_writes(metrics_port))
        print_fn(f"operator bench: restart over {n} converged deployments: all reconciled in "
                 f"{restart.seconds:.1f} s with {restart.writes:.0f} API writes")  # fmt: skip
        p99 = None
        if edit_latency:
            latencies = edit_to_child_seconds(
                cluster.kubeconfig, operator_ns, [d["metadata"]["name"] for d in docs]
            )
            p99 = percentile(latencies, 99)
            print_fn(
                f"operator bench: P4 spec edit -> StatefulSet updated, {len(latencies)} edits at N={n}: "
                f"p50 {percentile(latencies, 50) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms"
            )
        return Row(n, floor, elapsed, writes, rss, restart, p99)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        kubectl("delete", "namespace", operator_ns, "--wait=true")
        kubectl("delete", "pv", f"{floor_ns}-engines", f"{operator_ns}-engines", "--ignore-not-found")


def apply_in_parallel(kubectl: Kubectl, objs: list[dict[str, Any]], namespace: str) -> None:
    """Both sides submit alike: FLOOR_CLIENTS kubectl processes at once (one kubectl sends its
    objects one after the other, about 60 ms each here; alone, it would hold back whichever side
    it fed)."""
    slices = [part for part in (objs[i::FLOOR_CLIENTS] for i in range(FLOOR_CLIENTS)) if part]
    with ThreadPoolExecutor(FLOOR_CLIENTS) as pool:
        list(pool.map(lambda part: kubectl(
            "apply", "--server-side", "-f", "-", namespace=namespace,
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": part}),
        ), slices))  # fmt: skip


def _fresh_namespace(kubectl: Kubectl, ns: str) -> None:
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


def edit_to_child_seconds(
    kubeconfig: Path, namespace: str, names: list[str], samples: int = 100
) -> list[float]:
    """P4: one spec edit at a time (a new runtime profile, which changes the pod template), timed
    from the request until a watch sees the deployment's StatefulSet at a new generation."""
    client = Client(KubeConfig.from_file(kubeconfig), field_manager="bench")
    generation = {
        s.metadata.labels[L.DEPLOYMENT]: s.metadata.generation
        for s in client.list(StatefulSet, namespace=namespace)
        if s.metadata and s.metadata.labels and s.metadata.generation
    }
    updated: dict[str, float] = {}
    changed = threading.Condition()

    def watch() -> None:
        for _, sts in client.watch(StatefulSet, namespace=namespace):
            name = sts.metadata.labels.get(L.DEPLOYMENT) if sts.metadata and sts.metadata.labels else None
            if name and sts.metadata.generation > generation.get(name, sts.metadata.generation):  # type: ignore[union-attr, operator]
                with changed:
                    updated.setdefault(name, time.perf_counter())
                    changed.notify_all()

    threading.Thread(target=watch, daemon=True).start()
    time.sleep(2)  # the watch is established
    step = max(1, len(names) // samples)
    latencies = []
    for name in names[::step][:samples]:
        start = time.perf_counter()
        client.patch(LLMDeploymentResource, name, {"spec": {"runtime": {"profile": "throughput"}}},
                     namespace=namespace, patch_type=PatchType.MERGE)  # fmt: skip
        with changed:
            if not changed.wait_for(functools.partial(dict.__contains__, updated, name), timeout=60):
                raise SystemExit(f"bench: the StatefulSet of {name} was not updated 60 s after its edit")
        latencies.append(updated[name] - start)
    return latencies


def percentile(values: list[float], p: int) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def _up(port: int) -> bool:
    try:
        operator_writes(port)
        return True
    except OSError:
        return False


if __name__ == "__main__":
    run()
