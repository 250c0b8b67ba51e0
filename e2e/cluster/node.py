"""The real node: containerd + runc + CNI bridge, kubelet, kube-proxy (nftables) and CoreDNS, all in
the cluster's network namespace. Its configuration files, its cgroup root, and the teardown that
leaves no process, mount or cgroup behind (see /work/shared/reference/real-node.md for why each
setting is there); its images are containerd_images.py's.

Per instance (so two checkouts never share anything): the kubelet's root dir, pod logs and
cgroupRoot, containerd's root, state, socket and runc root, host-local's data dir. containerd's root
(content store, snapshots, image metadata) outlives `down` in the cache dir, so that an image
pulled once from the test registry (registry.py) is not pulled again at the next `up`; what the last
instance left of pods in it (containers, sandboxes) is removed before the kubelet starts.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from e2e.cluster.netns import NODE_IP
from e2e.cluster.pki import NODE_NAME, Pki

# In start order.
NODE_COMPONENTS = ("containerd", "kubelet", "kube-proxy", "coredns")
SHIM = "containerd-shim-runc-v2"
CLUSTER_CIDR = "10.244.0.0/16"
# The real node's share of the pod network (kwok hands out fake pod IPs from the start of the /16).
POD_CIDR = "10.244.100.0/24"
CLUSTER_DOMAIN = "cluster.local"
APISERVER_PORT = 6443
COREDNS_READY_PORT = 8181
KUBELET_HEALTHZ_PORT = 10248
CGROUP_FS = Path("/sys/fs/cgroup")
NODE_LABELS = {
    "topology.kubernetes.io/region": "us-east-1",
    "topology.kubernetes.io/zone": "us-east-1a",
    "node.kubernetes.io/instance-type": "real",
    "llm-operator.dev/real-node": "true",
}

COREDNS_RBAC: list[dict[str, Any]] = [
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "system:coredns"},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["endpoints", "services", "pods", "namespaces"],
                "verbs": ["list", "watch"],
            },
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "system:coredns"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:coredns"}],
    },
]


class NodeLayout:
    """Where one instance's node files live: `root` (persistent, in the state dir) and `run`
    (sockets and runtime state on /run: short paths, below the unix socket length limit)."""

    def __init__(self, root: Path, run: Path, cgroup: str, containerd_root: Path | None = None) -> None:
        self.root = root
        self.run = run
        self.cgroup = cgroup  # the kubelet's cgroupRoot, one level below each hierarchy's root
        # containerd's root: kept across `down` (images stay imported) when outside `root`.
        self.containerd_root = containerd_root or root / "containerd"

    @property
    def socket(self) -> Path:
        return self.run / "containerd.sock"

    @property
    def certs_d(self) -> Path:
        """containerd's registry host configuration (config_path; registry.write_hosts writes it)."""
        return self.root / "certs.d"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    def config(self, name: str) -> Path:
        return self.root / "config" / name


def _toml_str(value: str) -> str:
    return json.dumps(value)


CRI_PLUGIN = "io.containerd.grpc.v1.cri"


def containerd_config(layout: NodeLayout, sandbox_image: str, with_cri: bool = True) -> str:
    """The node's containerd; without CRI (no kubelet API, no recovery of old pods) it only
    serves images and containers to ctr: how `up` prepares the kept root before the kubelet."""
    disabled = "" if with_cri else f"disabled_plugins = [{_toml_str(CRI_PLUGIN)}]\n"
    cri = f'plugins."{CRI_PLUGIN}"'
    return f"""version = 2
root = {_toml_str(str(layout.containerd_root))}
state = {_toml_str(str(layout.run / "containerd"))}
{disabled}
[grpc]
  address = {_toml_str(str(layout.socket))}
[ttrpc]
  address = {_toml_str(str(layout.socket) + ".ttrpc")}

[plugins."io.containerd.internal.v1.opt"]
  path = {_toml_str(str(layout.root / "opt"))}

[{cri}]
  sandbox_image = {_toml_str(sandbox_image)}
  # No CAP_SYS_RESOURCE here: runc cannot lower oom_score_adj below containerd's own.
  restrict_oom_score_adj = true
  # Pod network namespaces under our own state dir, not /var/run/netns.
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [{cri}.registry]
    config_path = {_toml_str(str(layout.certs_d))}
  [{cri}.cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = {_toml_str(str(layout.root / "cni"))}
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
  [{cri}.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
  [{cri}.containerd.runtimes.runc.options]
    SystemdCgroup = false
    Root = {_toml_str(str(layout.run / "runc"))}
"""


def cni_config(layout: NodeLayout) -> dict[str, Any]:
    return {
        "cniVersion": "0.4.0",
        "name": "llmop",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": False,  # nothing outside the namespace to reach
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(layout.root / "cni-ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(layout: NodeLayout, pki: Pki) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{layout.cgroup}",
        "failSwapOn": False,
        "failCgroupV1": False,
        "containerRuntimeEndpoint": f"unix://{layout.socket}",
        "authentication": {
            "x509": {"clientCAFile": str(pki.ca.cert)},
            "webhook": {"enabled": True},
            "anonymous": {"enabled": False},
        },
        "authorization": {"mode": "Webhook"},
        "podCIDR": POD_CIDR,
        "clusterDNS": [NODE_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": "",  # pods get only cluster DNS: there is nothing upstream
        "readOnlyPort": 0,
        "address": NODE_IP,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": KUBELET_HEALTHZ_PORT,
        "podLogsDir": str(layout.root / "pod-logs"),
        "serializeImagePulls": False,
        "evictionHard": {"memory.available": "100Mi"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "nodeStatusReportFrequency": "10s",
    }


def kube_proxy_config(kubeconfig: Path) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "nftables",
        "clusterCIDR": CLUSTER_CIDR,
        "hostnameOverride": NODE_NAME,
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "conntrack": {"maxPerCore": 0},
        "metricsBindAddress": "127.0.0.1:10249",
        "healthzBindAddress": "127.0.0.1:10256",
    }


def corefile(kubeconfig: Path, context: str) -> str:
    return f""".:53 {{
    bind {NODE_IP}
    ready 127.0.0.1:{COREDNS_READY_PORT}
    health 127.0.0.1:8080
    errors
    loadbalance
    cache 5
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig} {context}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
}}
"""


def write_configs(
    layout: NodeLayout, pki: Pki, sandbox_image: str, kubeconfigs: dict[str, Path], context: str
) -> None:
    for sub in ("config", "cni", "cni-ipam", "kubelet", "pod-logs", "opt"):
        (layout.root / sub).mkdir(parents=True, exist_ok=True)
    layout.containerd_root.mkdir(parents=True, exist_ok=True)
    layout.run.mkdir(parents=True, exist_ok=True)
    layout.config("containerd.toml").write_text(containerd_config(layout, sandbox_image))
    layout.config("containerd-images.toml").write_text(
        containerd_config(layout, sandbox_image, with_cri=False)
    )
    (layout.root / "cni" / "10-llmop.conflist").write_text(json.dumps(cni_config(layout), indent=2))
    layout.config("kubelet.yaml").write_text(yaml.safe_dump(kubelet_config(layout, pki)))
    layout.config("kube-proxy.yaml").write_text(yaml.safe_dump(kube_proxy_config(kubeconfigs["kube-proxy"])))
    layout.config("Corefile").write_text(corefile(kubeconfigs["coredns"], context))


def command_lines(layout: NodeLayout, kubeconfigs: dict[str, Path]) -> dict[str, list[str]]:
    """Arguments of each node component (without the binary); "containerd-images" is containerd
    without its CRI plugin, which `up` runs first to tidy the kept root and import images."""
    labels = ",".join(f"{k}={v}" for k, v in NODE_LABELS.items())
    return {
        "containerd-images": ["--config", str(layout.config("containerd-images.toml"))],
        "containerd": ["--config", str(layout.config("containerd.toml"))],
        "kubelet": [
            f"--config={layout.config('kubelet.yaml')}",
            f"--kubeconfig={kubeconfigs['kubelet']}",
            f"--root-dir={layout.kubelet_root}",
            f"--cert-dir={layout.kubelet_root / 'pki'}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={NODE_IP}",
            f"--node-labels={labels}",
        ],
        "kube-proxy": [f"--config={layout.config('kube-proxy.yaml')}"],
        "coredns": ["-conf", str(layout.config("Corefile"))],
    }


# -- cgroups ----------------------------------------------------------------------------------------
def _hierarchies() -> list[Path]:
    """The cgroup v1 hierarchies mounted under /sys/fs/cgroup (cgroup v2's unified excluded)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        fstype = after.split()[0] if after else ""
        mountpoint = Path(before.split()[4])
        if fstype == "cgroup" and mountpoint.parent == CGROUP_FS:
            found.append(mountpoint)
    return sorted(set(found))


def create_cgroups(name: str) -> None:
    """The kubelet's cgroupRoot in every v1 hierarchy; cpuset needs cpus/mems before any task."""
    for hierarchy in _hierarchies():
        path = hierarchy / name
        path.mkdir(exist_ok=True)
        if (hierarchy / "cpuset.cpus").exists():
            for key in ("cpuset.cpus", "cpuset.mems"):
                (path / key).write_text((hierarchy / key).read_text())


def _cgroup_dirs(name: str) -> list[Path]:
    """Every directory of cgroup tree `name` in every hierarchy, deepest first."""
    dirs: list[Path] = []
    for hierarchy in CGROUP_FS.iterdir():
        top = hierarchy / name
        if top.is_dir():
            dirs += [Path(d) for d, _, _ in os.walk(top)]
    return sorted(dirs, key=lambda p: len(p.parts), reverse=True)


def cgroup_pids(name: str) -> set[int]:
    pids: set[int] = set()
    for d in _cgroup_dirs(name):
        with contextlib.suppress(OSError, ValueError):
            pids |= {int(p) for p in (d / "cgroup.procs").read_text().split()}
    return pids


def kill_cgroup_tree(name: str, timeout: float = 10.0) -> None:
    """SIGKILL every process in cgroup tree `name` (pod processes) until none is left."""
    deadline = time.monotonic() + timeout
    while (pids := cgroup_pids(name)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        time.sleep(0.05)


def remove_cgroups(name: str, timeout: float = 10.0) -> list[Path]:
    """rmdir the tree depth-first (a cgroup dies with its last task: retry while busy); returns
    what could not be removed."""
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for d in _cgroup_dirs(name):
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                left.append(d)
        if not left or time.monotonic() > deadline:
            return left
        kill_cgroup_tree(name, 1.0)
        time.sleep(0.1)


# -- mounts -----------------------------------------------------------------------------------------
def _unescape(path: str) -> str:
    return path.encode().decode("unicode_escape") if "\\" in path else path


def mounts_under(roots: Iterable[Path]) -> list[str]:
    """Mount points at or below any of `roots` (overlay rootfs, shm, nsfs, kubelet tmpfs), deepest first."""
    prefixes = [str(r).rstrip("/") for r in roots]
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = _unescape(line.split()[4])
        if any(point == p or point.startswith(p + "/") for p in prefixes):
            found.append(point)
    return sorted(found, key=lambda p: p.count("/"), reverse=True)


_libc = ctypes.CDLL(None, use_errno=True)
MNT_DETACH = 2


def unmount_under(roots: Iterable[Path]) -> list[str]:
    """Unmount everything below `roots` (lazily where busy); returns what stayed mounted."""
    roots = list(roots)
    for _ in range(5):
        points = mounts_under(roots)
        if not points:
            return []
        for point in points:
            if _libc.umount2(point.encode(), 0) != 0:
                _libc.umount2(point.encode(), MNT_DETACH)
    return mounts_under(roots)
