"""The test world's NetworkPolicy enforcer: kube-router's network policy controller, alone.

The real node's CNI (the bridge plugin, node.py) does not enforce NetworkPolicy, and the nftables
enforcer kind embeds (kube-network-policies) needs NFQUEUE, which this kernel lacks
(CONFIG_NFT_QUEUE unset). kube-router's controller needs only iptables, ipset, the physdev match and
br_netfilter, which it has; kube-router documents running the controller by itself beside another
CNI (`--run-router=false --run-service-proxy=false`). It runs on the real node inside the cluster's
network namespace like kube-proxy, with iptables-nft (Debian's default `iptables`); kube-proxy runs
in nftables mode, in its own table, so the two never touch each other's rules.

Like every kube-router, it admits traffic to a pod from the pod's own node (addrtype LOCAL, which
kubelet probes need): in the test world Prometheus, Traefik and the tests' sockets all run on the
node address, so they reach pods whatever the policy says. Pod-to-pod traffic is what is enforced.
"""

from __future__ import annotations

from typing import Any

from e2e.cluster import kubeconfig, netns
from e2e.cluster import node as node_mod
from e2e.cluster import pki as pki_mod
from e2e.cluster.state import StateDir

COMPONENTS = ("kube-router",)
BINARIES = ("kube-router",)
# Its /healthz; kube-router binds it on every address of the namespace (it has no address flag).
HEALTH_PORT = 20244
USER = pki_mod.CLIENTS["kube-router"][0]

# What its informers list and watch (kube-router's cmd starts them all, whichever controllers run);
# the policy controller writes nothing to the API.
RBAC: list[dict[str, Any]] = [
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "e2e:kube-router"},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["namespaces", "pods", "services", "nodes", "endpoints"],
                "verbs": ["get", "list", "watch"],
            },
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
            {
                "apiGroups": ["networking.k8s.io"],
                "resources": ["networkpolicies"],
                "verbs": ["list", "watch"],
            },
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "e2e:kube-router"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "e2e:kube-router",
        },
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
    },
]


def prepare(state: StateDir, pki: pki_mod.Pki) -> list[str]:
    """Write kube-router's kubeconfig; returns its arguments."""
    kc = state.component_kubeconfig("kube-router")
    kubeconfig.write(kc, node_mod.APISERVER_PORT, pki, "kube-router", host=netns.NODE_IP)
    return [
        "--run-firewall=true",
        "--run-router=false",
        "--run-service-proxy=false",
        "--enable-cni=false",
        f"--hostname-override={pki_mod.NODE_NAME}",
        f"--kubeconfig={kc}",
        f"--service-cluster-ip-range={pki_mod.SERVICE_CLUSTER_IP_RANGE}",
        f"--health-port={HEALTH_PORT}",
        "--metrics-port=0",
        # Each full sync and how long it took, in logs/kube-router.log: what a test that waits on
        # enforcement reads when it times out.
        "--v=1",
    ]
