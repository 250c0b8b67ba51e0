"""The control plane's command lines: the flags each component starts with, and why."""

from __future__ import annotations

from pathlib import Path

from e2e.cluster import netns
from e2e.cluster import node as node_mod
from e2e.cluster import pki as pki_mod
from e2e.cluster.state import StateDir

ETCD_PORT, ETCD_PEER_PORT = 2379, 2380
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"


def etcd_args(state: StateDir) -> list[str]:
    client_url, peer_url = f"http://127.0.0.1:{ETCD_PORT}", f"http://127.0.0.1:{ETCD_PEER_PORT}"
    return [
        "--name=llmop",
        f"--data-dir={state.etcd_dir}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=llmop={peer_url}",
        "--unsafe-no-fsync",  # throwaway data: fsync only costs time
    ]


def apiserver_args(pki: pki_mod.Pki) -> list[str]:
    kubelet_client = pki.clients["apiserver-kubelet-client"]
    return [
        f"--etcd-servers=http://127.0.0.1:{ETCD_PORT}",
        # The node address inside the namespace: the `kubernetes` Service gets it as its endpoint,
        # so pods reach the API at 10.96.0.1; the host comes in through the forwarder.
        f"--bind-address={netns.NODE_IP}",
        f"--secure-port={node_mod.APISERVER_PORT}",
        f"--advertise-address={netns.NODE_IP}",
        f"--tls-cert-file={pki.apiserver.cert}",
        f"--tls-private-key-file={pki.apiserver.key}",
        f"--client-ca-file={pki.ca.cert}",
        "--authorization-mode=Node,RBAC",
        f"--service-account-issuer={SA_ISSUER}",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        f"--service-cluster-ip-range={pki_mod.SERVICE_CLUSTER_IP_RANGE}",
        "--allow-privileged=true",
        # logs/exec/port-forward: the API server dials the kubelet by address (no DNS for node names).
        f"--kubelet-client-certificate={kubelet_client.cert}",
        f"--kubelet-client-key={kubelet_client.key}",
        "--kubelet-preferred-address-types=InternalIP,Hostname",
        # Front proxy: lets aggregated APIs (custom/external metrics) trust the aggregator.
        f"--requestheader-client-ca-file={pki.front_proxy_ca.cert}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki.front_proxy_client.cert}",
        f"--proxy-client-key-file={pki.front_proxy_client.key}",
    ]


def client_args(state: StateDir, component: str, port: int) -> list[str]:
    """Flags the controller manager and the scheduler share."""
    kc = state.component_kubeconfig(component)
    return [
        f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        # Single instance: a leader lease would only delay restarts.
        "--leader-elect=false",
    ]


def controller_manager_args(pki: pki_mod.Pki) -> list[str]:
    return [
        f"--root-ca-file={pki.ca.cert}",
        f"--service-account-private-key-file={pki.sa_key}",
        "--use-service-account-credentials=false",
        f"--cluster-signing-cert-file={pki.ca.cert}",
        f"--cluster-signing-key-file={pki.ca.key}",
        # Test-speed HPA loops (defaults: 15 s sync, 5 min downscale stabilization).
        "--horizontal-pod-autoscaler-sync-period=2s",
        "--horizontal-pod-autoscaler-downscale-stabilization=10s",
    ]


def kwok_args(state: StateDir, stages: Path) -> list[str]:
    return [
        f"--kubeconfig={state.component_kubeconfig('kwok')}",
        # kwok's default pod stages plus its chaos stage (build-tools.sh copies them from the module).
        "--config=" + ",".join(str(f) for f in sorted(stages.glob("*.yaml"))),
        # Only the simulated nodes: the real node's pods are the kubelet's.
        "--manage-all-nodes=false",
        "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
        # Without a lease duration kwok v0.7.0 renews no node leases and heartbeats node
        # status only every ~10 min: the node lifecycle controller then marks every node
        # NotReady after ~50 s (NodeNotReady events) and kwok flips it back. Measured here.
        "--node-lease-duration-seconds=40",
        "--cidr=10.244.0.0/16",
    ]
