"""Proof that the embedded cluster is the real thing (scheduler, GC, HPA controller, kwok, a real
node with kubelet, containerd, kube-proxy and CoreDNS in a private network namespace), plus the
launcher's failure behaviour and teardown. Unmarked tests here are pure (fake binaries) and run in
test-unit."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import Cluster, ClusterError, addons, busybox_image, netns
from e2e.cluster.components import COMPONENTS, run_build_tools
from e2e.cluster.node import SHIM, mounts_under
from e2e.cluster.nodes import build_nodes, load_pools
from e2e.cluster.pki import NODE_NAME
from e2e.cluster.processes import find_owned, free_port
from e2e.cluster.state import REPO_ROOT, StateDir
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
    state = StateDir(state_dir)
    found = find_owned(COMPONENTS, state.root) | find_owned({SHIM}, state.run_dir)
    return [p for p in found if p != os.getpid()]


def _leftovers(state_dir: Path) -> dict[str, Any]:
    """Everything an instance may leave outside its state dir (all must be empty)."""
    state = StateDir(state_dir)
    return {
        "processes": _processes_of(state_dir),
        "netns": netns.exists(state.netns),
        "run dir": state.run_dir.exists(),
        "mounts": mounts_under([state.root, state.run_dir]),
        "cgroups": sorted(str(p) for p in Path("/sys/fs/cgroup").glob(f"*/{state.cgroup}")),
        "private addresses or routes in the host namespace": netns.private_in_host(),
    }


NOTHING_LEFT = {
    "processes": [],
    "netns": False,
    "run dir": False,
    "mounts": [],
    "cgroups": [],
    "private addresses or routes in the host namespace": [],
}


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


def test_a_cluster_records_its_add_ons_and_one_from_before_add_ons_runs_them_all(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "state")
    state.create({"kube-apiserver": 6443}, {})
    # cluster.json of a cluster started before there were add-ons: it ran the whole test world.
    assert state.addons(before_addons=addons.ALL) == list(addons.ALL)
    state.record({"kube-apiserver": 6443, "prometheus": 9090}, {}, [])
    assert state.addons(before_addons=addons.ALL) == []
    state.record(state.ports(), {"prometheus": Path("/bin/true")}, ["monitoring", "monitoring"])
    assert state.addons() == ["monitoring"]
    assert state.ports() == {"kube-apiserver": 6443, "prometheus": 9090}
    assert state.meta()["tools"] == {"prometheus": "/bin/true"}


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
    assert _leftovers(state) == NOTHING_LEFT
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


def up_with_a_bad_flag(state: Path, component: str) -> tuple[Path, str]:
    """`up` of a fresh cluster in `state` (with the add-on `component` belongs to, if any) whose
    `component` gets an unknown flag: its state directory and the one-line error it fails with."""
    failing = Cluster(
        state, extra_args={component: ["--no-such-flag"]}, node_images=("pause",), log=lambda _: None
    )
    try:
        with pytest.raises(ClusterError) as info:
            failing.up(addons=[a.name for a in addons.ADDONS.values() if component in a.components])
    finally:  # a cluster that started after all is stopped too (and its node cache removed)
        failing.down(keep_images=False)
    message = str(info.value)
    assert "\n" not in message
    return state, message


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("component", "code"),
    [("kube-apiserver", 1), ("kube-controller-manager", 1), ("kubelet", 1), ("kube-router", 2)],
)
def test_real_component_failure_stops_everything(state_dir: Path, component: str, code: int) -> None:
    """An unknown flag: the apiserver exits at once (etcd must be stopped), the controller manager
    after the apiserver is up, the kubelet after containerd is up, kube-router (the last node
    component) once the real node is Ready: everything started before it, the namespace, mounts
    and cgroups included, must be gone."""
    state, message = up_with_a_bad_flag(state_dir, component)
    assert message.startswith(f"{component} exited with code {code} during startup")
    assert "unknown flag: --no-such-flag" in message
    assert f"(log: {state / 'logs' / component}.log)" in message
    assert _leftovers(state) == NOTHING_LEFT


# Its own test pods (not the operator's) run as the image's root user: baseline, not restricted.
@pytest.mark.pod_security("baseline")
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


# Its own test pods (not the operator's) run as the image's root user: baseline, not restricted.
@pytest.mark.pod_security("baseline")
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


# Its own test pods (not the operator's) run as the image's root user: baseline, not restricted.
@pytest.mark.pod_security("baseline")
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
                                    # Imported into the real node at `up`, where this pod runs.
                                    "image": "localhost/llm-operator/pause:dev",
                                    "imagePullPolicy": "IfNotPresent",
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
    pids = {c: s["pid"] for c, s in cluster.launcher.status()["components"].items()}
    assert set(pids) == set(COMPONENTS)  # a test session runs every add-on
    report = Cluster(cluster.launcher.state_dir).up(session=os.getpid(), addons=addons.ALL)
    assert report.already_running
    assert report.added == []
    assert report.seconds < 5
    assert {c: s["pid"] for c, s in cluster.launcher.status()["components"].items()} == pids


def test_build_tools_reports_missing_binaries(tmp_path: Path) -> None:
    script = tmp_path / "build-tools.sh"
    script.write_text(f"#!/bin/sh\necho {tmp_path}\n")
    with pytest.raises(ClusterError, match=r"build-tools.sh produced no etcd binary in"):
        run_build_tools(lambda _: None, script)


# -- the real node ----------------------------------------------------------------------------------
WEB_IMAGE = "localhost/llm-operator/busybox:e2e"


def _launcher(cluster: E2ECluster) -> Cluster:
    if cluster.launcher is None:
        pytest.skip("the real node and its namespace belong to the embedded cluster")
    return cluster.launcher


def _web(namespace: str) -> list[dict[str, Any]]:
    """busybox httpd (logs every request) behind a Service, Ready through a real HTTP probe."""
    labels = {"app": "web"}
    container = {
        "name": "web",
        "image": WEB_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/httpd", "-f", "-v", "-p", "8080", "-h", "/www"],
        "ports": [{"containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/index.html", "port": 8080}, "periodSeconds": 1},
        # A projected token and an emptyDir: kubelet tmpfs and bind mounts to clean up later.
        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web", "labels": labels},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": NODE_NAME},
                "containers": [container],
                "volumes": [{"name": "scratch", "emptyDir": {}}],
                "terminationGracePeriodSeconds": 1,
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web"},
            "spec": {"selector": labels, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    ]


def _http_get(sock: socket.socket, host: str, path: str) -> str:
    with sock:
        sock.sendall(f"GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.decode(errors="replace").partition("\r\n\r\n")
    assert head.split()[1] == "200", head
    return body


@pytest.mark.e2e
def test_real_node_is_ready_beside_the_kwok_pools(cluster: E2ECluster, kubectl: Kubectl) -> None:
    _launcher(cluster)
    nodes = {n["metadata"]["name"]: n for n in kubectl.json("get", "nodes")["items"]}
    real = nodes[NODE_NAME]
    assert is_true(real, "Ready")
    assert "kwok.x-k8s.io/node" not in real["metadata"].get("annotations", {})
    assert real["status"]["nodeInfo"]["kubeletVersion"] == "v1.34.4"
    assert real["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert not real["spec"].get("taints"), "CPU-only pods run on the real node"
    assert {a["type"]: a["address"] for a in real["status"]["addresses"]}["InternalIP"] == netns.NODE_IP
    kwok = [
        n for n in nodes.values() if n["metadata"].get("annotations", {}).get("kwok.x-k8s.io/node") == "fake"
    ]
    assert len(kwok) == len(nodes) - 1
    assert all(is_true(n, "Ready") for n in kwok)


# Its own test pods (not the operator's) run as the image's root user: baseline, not restricted.
@pytest.mark.pod_security("baseline")
@pytest.mark.e2e
def test_pod_on_the_real_node_is_served_probed_resolved_and_reachable(
    cluster: E2ECluster, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    """A locally imported image runs on the real node, becomes Ready through an HTTP probe, answers
    on its ClusterIP (kube-proxy, nftables) inside the namespace, resolves a *.svc name (CoreDNS),
    reaches the API server through the kubernetes Service, and serves logs, exec and port-forward."""
    launcher = _launcher(cluster)
    archive = busybox_image.write(tmp_path / "web.oci.tar", WEB_IMAGE, ["/bin/sh"])
    assert launcher.import_image(archive) == [WEB_IMAGE]
    kubectl.apply(_web(namespace), namespace)
    pod = wait_for(
        "pod web Ready (HTTP readiness probe)", lambda: kubectl.get("pod", "web", namespace), pod_ready
    )
    assert pod is not None
    assert pod["spec"]["nodeName"] == NODE_NAME
    assert pod["status"]["podIP"].startswith("10.244.100.")

    service = kubectl.get("service", "web", namespace)
    assert service is not None
    cluster_ip = service["spec"]["clusterIP"]
    body = wait_for(
        f"GET http://{cluster_ip}/index.html from inside the namespace",
        lambda: _http_get(netns.connect(launcher.netns, cluster_ip, 80), cluster_ip, "/index.html"),
        lambda b: b == "ok\n",
        timeout=30,
    )
    assert body == "ok\n"

    # (-n before `--`: Kubectl's namespace= would land after it, among the command's arguments)
    lookup = kubectl("exec", "-n", namespace, "web", "--", "nslookup", f"web.{namespace}.svc.cluster.local")
    assert f"Address: {cluster_ip}" in lookup.stdout
    api = kubectl(
        "exec", "-n", namespace, "web", "--", "sh", "-c", "echo | nc -w 3 10.96.0.1 443 && echo connected"
    )
    assert api.stdout.strip().endswith("connected")

    # httpd -v logs every request, the kubelet's probes included.
    wait_for(
        "probe requests in kubectl logs",
        lambda: kubectl("logs", "web", namespace=namespace).stdout,
        lambda out: "response:200" in out,
    )

    port = free_port()
    forward = subprocess.Popen(
        [
            kubectl.binary,
            f"--kubeconfig={kubectl.kubeconfig}",
            "-n",
            namespace,
            "port-forward",
            "pod/web",
            f"{port}:8080",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(
            "GET through kubectl port-forward",
            lambda: _http_get(
                socket.create_connection(("127.0.0.1", port), timeout=3), "localhost", "/index.html"
            ),
            lambda b: b == "ok\n",
            timeout=30,
        )
    finally:
        forward.terminate()
        forward.wait(10)


@pytest.mark.e2e
def test_down_leaves_no_process_mount_cgroup_or_namespace(
    cluster: E2ECluster, tmp_path: Path, state_dir: Path
) -> None:
    """A second instance (own state dir, namespace, cgroup, containerd) with a running pod, then
    `down`: nothing of it may remain, and the host namespace has no private address or route."""
    _launcher(cluster)
    state = state_dir
    other = Cluster(state, node_images=("pause",), log=lambda _: None)
    try:
        report = other.up()
        assert not report.already_running
        other.import_image(busybox_image.write(tmp_path / "web.oci.tar", WEB_IMAGE, ["/bin/sh"]))
        kc = Kubectl(other.kubeconfig, other.bin_dir / "kubectl")
        kc.apply(_web("default"), "default")
        wait_for("pod web Ready", lambda: kc.get("pod", "web", "default"), pod_ready)
        running = _leftovers(state)
        assert running["netns"] and running["run dir"]
        assert running["processes"] and running["mounts"] and running["cgroups"]
        assert running["private addresses or routes in the host namespace"] == []
    finally:
        start = time.monotonic()
        other.down(keep_images=False)
        took = time.monotonic() - start
    assert _leftovers(state) == NOTHING_LEFT
    assert not state.exists()
    assert took < 30, json.dumps(took)


@pytest.mark.e2e
def test_an_add_on_joins_a_running_core_cluster_and_one_that_fails_leaves_the_core_serving(
    cluster: E2ECluster, state_dir: Path
) -> None:
    """What `make demo` does on the way (`up --with NAME` on the core it started) and a test
    session after it: the add-on starts beside the running processes, none of which restarts;
    an add-on that cannot start is stopped again and the core keeps serving."""
    _launcher(cluster)
    state = state_dir
    core = Cluster(state, node_images=("pause",), log=lambda _: None)
    try:
        first = core.up()
        assert not first.already_running and first.addons == []
        assert "kube-router" not in core.status()["components"]
        pids = {c: s["pid"] for c, s in core.status()["components"].items()}

        broken = Cluster(state, extra_args={"kube-router": ["--no-such-flag"]}, log=lambda _: None)
        with pytest.raises(ClusterError, match=r"^kube-router exited with code 2 during startup"):
            broken.up(addons=["enforcer"])
        assert _processes_named(state, "kube-router") == []
        after = core.status()
        assert after["apiserver_ready"] and after["nodes_ready"] == after["nodes_total"]
        assert {c: s["pid"] for c, s in after["components"].items()} == pids  # nothing restarted

        added = core.up(addons=["enforcer"])
        assert added.already_running and added.added == ["enforcer"] and added.addons == ["enforcer"]
        status = core.status()["components"]
        assert status["kube-router"]["running"]
        assert {c: status[c]["pid"] for c in pids} == pids
        again = core.up(addons=["enforcer"])
        assert again.added == [] and again.seconds < 5
    finally:
        core.down(keep_images=False)
    assert _leftovers(state) == NOTHING_LEFT


def _processes_named(state_dir: Path, name: str) -> list[int]:
    return [p for p, n in find_owned({name}, StateDir(state_dir).root).items()]
