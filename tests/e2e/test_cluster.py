"""Proof that the embedded control plane is the real thing (scheduler, GC, HPA controller, kwok), plus
the launcher's failure behaviour. Unmarked tests here are pure (fake binaries) and run in test-unit."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import Cluster, ClusterError
from e2e.cluster.components import COMPONENTS, run_build_tools
from e2e.cluster.nodes import build_nodes, load_pools
from e2e.cluster.processes import proc_args
from e2e.cluster.state import REPO_ROOT
from e2e.cluster.testing import E2ECluster, Kubectl, condition, is_true, pod_ready, wait_for

H100 = "NVIDIA-H100-80GB-HBM3"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _gpu_container(gpus: int) -> dict[str, Any]:
    # Extended resources must have limits == requests; the image is never pulled (kwok).
    resources = {"nvidia.com/gpu": str(gpus), "cpu": "4", "memory": "32Gi"}
    return {
        "name": "server",
        "image": "nvcr.io/nvidia/tritonserver:25.01-trtllm-python-py3",
        "resources": {"limits": resources, "requests": resources},
    }


def _processes_of(state_dir: Path) -> list[int]:
    needle = f"{state_dir.resolve()}/"
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            args = proc_args(int(entry.name))
            if any(Path(a).name in COMPONENTS for a in args[:2]) and any(needle in a for a in args):
                pids.append(int(entry.name))
    return pids


# -- node pools (pure) ----------------------------------------------------------------------------


def test_node_pools_are_valid_nodes() -> None:
    nodes = build_nodes(load_pools())
    assert len({n["metadata"]["name"] for n in nodes}) == len(nodes)
    for node in nodes:
        for key, value in node["metadata"]["labels"].items():
            assert len(value) <= 63, f"{node['metadata']['name']}: {key}={value}"
            assert LABEL_VALUE.match(value), f"{node['metadata']['name']}: {key}={value}"
        gpus = node["status"]["capacity"].get("nvidia.com/gpu")
        taints = node["spec"]["taints"]
        if gpus:
            assert taints == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
            assert node["metadata"]["labels"]["nvidia.com/gpu.count"] == gpus
        else:
            assert taints == []
    by_product: dict[str, list[dict[str, Any]]] = {}
    for n in nodes:
        by_product.setdefault(n["metadata"]["labels"].get("nvidia.com/gpu.product", "none"), []).append(n)
    h100 = by_product[H100]
    assert len(h100) >= 4
    assert len({n["metadata"]["labels"]["topology.kubernetes.io/zone"] for n in h100}) >= 2
    assert len({n["metadata"]["labels"]["topology.k8s.aws/network-node-layer-3"] for n in h100}) >= 2
    cliques = [n["metadata"]["labels"].get("nvidia.com/gpu.clique") for n in by_product["NVIDIA-GB200"]]
    assert len(set(cliques)) == 2
    assert all(cliques.count(c) >= 2 for c in cliques)


# -- launcher failure paths (pure: fake binaries) ---------------------------------------------------


def _fake_tools(tmp_path: Path, failing: str, script: str) -> dict[str, Path]:
    """Shell scripts standing in for the binaries: `failing` runs `script`, the rest sleep."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tools = {}
    for name in (*COMPONENTS, "kubectl", "helm"):
        path = bindir / name
        path.write_text("#!/bin/sh\n" + (script if name == failing else "exec sleep 600\n"))
        path.chmod(0o755)
        tools[name] = path
    return tools


def test_component_exit_is_one_clear_line_and_leaves_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    tools = _fake_tools(
        tmp_path, "etcd", 'echo "listen tcp 127.0.0.1:2379: bind: address already in use" >&2; exit 1\n'
    )
    with pytest.raises(ClusterError) as info:
        Cluster(state, tools=tools, log=lambda _: None).up()
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("etcd exited with code 1 during startup: listen tcp")
    assert "address already in use" in message
    assert message.endswith(f"(log: {state / 'logs' / 'etcd.log'})")
    assert _processes_of(state) == []
    assert [p.name for p in state.iterdir()] == ["logs"]  # the log named in the error survives


def test_missing_go_fails_with_one_line(tmp_path: Path) -> None:
    env_path = "/usr/bin:/bin"
    if shutil.which("go", path=env_path):
        pytest.skip("go is installed in /usr/bin or /bin")
    proc = subprocess.run(
        [sys.executable, "-m", "e2e.cluster", "up", "--state-dir", str(tmp_path / "state")],
        cwd=REPO_ROOT,
        env={**os.environ, "PATH": env_path},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "cluster up failed: build-tools.sh failed (exit 1): Go is not installed "
        "(need go >= 1.26 on PATH to build the control plane)"
    ]


# -- against the real programs ------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("component", ["kube-apiserver", "kube-controller-manager"])
def test_real_component_failure_stops_everything(tmp_path: Path, component: str) -> None:
    """Port in use for the apiserver (it exits at once); an unknown flag for the controller manager
    (it exits after etcd and the apiserver are up, which must then be stopped too)."""
    state = tmp_path / "state"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        bad = {
            "kube-apiserver": [f"--secure-port={busy.getsockname()[1]}"],
            "kube-controller-manager": ["--no-such-flag"],
        }
        with pytest.raises(ClusterError) as info:
            Cluster(state, extra_args={component: bad[component]}, log=lambda _: None).up()
    message = str(info.value)
    expected = {
        "kube-apiserver": "address already in use",
        "kube-controller-manager": "unknown flag: --no-such-flag",
    }
    assert message.startswith(f"{component} exited with code 1 during startup")
    assert expected[component] in message
    assert f"(log: {state / 'logs' / component}.log)" in message
    assert _processes_of(state) == []


@pytest.mark.e2e
def test_gpu_statefulset_lands_on_h100_becomes_ready_and_survives_pod_deletion(
    cluster: E2ECluster, kubectl: Kubectl, namespace: str
) -> None:
    if not cluster.gpu_nodes(H100):
        pytest.skip(f"no {H100} nodes in this cluster")
    labels = {"app": "h100"}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "nvidia.com/gpu.product", "operator": "In", "values": [H100]}
                        ]
                    }
                ]
            }
        }
    }
    kubectl.apply(
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "h100"},
            "spec": {
                "replicas": 1,
                "serviceName": "h100",
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "affinity": affinity,
                        "tolerations": [GPU_TOLERATION],
                        "containers": [_gpu_container(8)],
                    },
                },
            },
        },
        namespace,
    )
    pod = wait_for("pod h100-0 Running and Ready", lambda: kubectl.get("pod", "h100-0", namespace), pod_ready)
    assert pod is not None
    node = kubectl.get("node", pod["spec"]["nodeName"])
    assert node is not None
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == H100
    wait_for(
        "StatefulSet h100 readyReplicas == 1",
        lambda: kubectl.get("statefulset", "h100", namespace),
        lambda s: s is not None and s.get("status", {}).get("readyReplicas") == 1,
    )
    # No kubelet confirms a graceful deletion: kwok must finalize it, or the pod stays Terminating.
    kubectl.delete("pod", "h100-0", namespace, wait=True, timeout=30)
    wait_for(
        "pod h100-0 replaced by a new Ready pod",
        lambda: kubectl.get("pod", "h100-0", namespace),
        lambda p: pod_ready(p) and p is not None and p["metadata"]["uid"] != pod["metadata"]["uid"],
        timeout=30,
    )


@pytest.mark.e2e
def test_pod_wanting_more_gpus_than_any_node_stays_pending(
    cluster: E2ECluster, kubectl: Kubectl, namespace: str
) -> None:
    most = max((int(n["status"]["allocatable"]["nvidia.com/gpu"]) for n in cluster.gpu_nodes()), default=0)
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "too-big"},
            "spec": {"tolerations": [GPU_TOLERATION], "containers": [_gpu_container(most + 1)]},
        },
        namespace,
    )
    events = wait_for(
        "a FailedScheduling event for pod too-big",
        lambda: [e for e in kubectl.events(namespace, "too-big") if e["reason"] == "FailedScheduling"],
    )
    assert "Insufficient nvidia.com/gpu" in events[0]["message"]
    pod = kubectl.get("pod", "too-big", namespace)
    assert pod is not None
    assert pod["status"]["phase"] == "Pending"
    assert not pod["spec"].get("nodeName")
    scheduled = condition(pod, "PodScheduled")
    assert scheduled is not None
    assert scheduled["reason"] == "Unschedulable"


@pytest.mark.e2e
def test_deleting_owner_garbage_collects_owned_configmap(kubectl: Kubectl, namespace: str) -> None:
    (owner,) = kubectl.apply(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}}, namespace
    )
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    kubectl.apply(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owned", "ownerReferences": [ref]}},
        namespace,
    )
    kubectl.delete("configmap", "owner", namespace)
    wait_for(
        "ConfigMap owned to be garbage-collected",
        lambda: kubectl.get("configmap", "owned", namespace) is None,
    )


@pytest.mark.e2e
def test_hpa_status_is_written_by_the_hpa_controller(kubectl: Kubectl, namespace: str) -> None:
    labels = {"app": "web"}
    resources = {"cpu": "100m", "memory": "64Mi"}
    kubectl.apply(
        [
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "web"},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "containers": [
                                {
                                    "name": "web",
                                    "image": "registry.k8s.io/pause:3.10",
                                    "resources": {"requests": resources, "limits": resources},
                                }
                            ]
                        },
                    },
                },
            },
            {
                "apiVersion": "autoscaling/v2",
                "kind": "HorizontalPodAutoscaler",
                "metadata": {"name": "web"},
                "spec": {
                    "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                    "minReplicas": 1,
                    "maxReplicas": 3,
                    "metrics": [
                        {
                            "type": "Resource",
                            "resource": {
                                "name": "cpu",
                                "target": {"type": "Utilization", "averageUtilization": 50},
                            },
                        }
                    ],
                },
            },
        ],
        namespace,
    )
    hpa = wait_for(
        "HPA web status with currentReplicas == 1 and AbleToScale=True",
        lambda: kubectl.get("hpa", "web", namespace),
        lambda h: (
            h is not None and h.get("status", {}).get("currentReplicas") == 1 and is_true(h, "AbleToScale")
        ),
    )
    able = condition(hpa, "AbleToScale")
    assert able is not None
    assert able["reason"] in (
        "SucceededGetScale",
        "ReadyForNewScale",
        "SucceededRescale",
    )


@pytest.mark.e2e
def test_version_is_pinned_kubernetes(cluster: E2ECluster, kubectl: Kubectl) -> None:
    if not cluster.embedded:
        pytest.skip("the version is only pinned for the embedded cluster")
    version = kubectl.json("version")["serverVersion"]
    assert version["gitVersion"] == "v1.34.4"
    assert (version["major"], version["minor"]) == ("1", "34")


@pytest.mark.e2e
def test_up_on_running_cluster_is_a_fast_no_op(cluster: E2ECluster) -> None:
    if cluster.launcher is None:
        pytest.skip("external cluster")
    pids = {c: cluster.launcher.status()["components"][c]["pid"] for c in COMPONENTS}
    report = Cluster(cluster.launcher.state_dir).up(session=os.getpid())
    assert report.already_running
    assert report.seconds < 5
    assert {c: cluster.launcher.status()["components"][c]["pid"] for c in COMPONENTS} == pids


def test_build_tools_reports_missing_binaries(tmp_path: Path) -> None:
    script = tmp_path / "build-tools.sh"
    script.write_text(f"#!/bin/sh\necho {tmp_path}\n")
    with pytest.raises(ClusterError, match=r"build-tools.sh produced no etcd binary in"):
        run_build_tools(lambda _: None, script)
