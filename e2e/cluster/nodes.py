"""Turns gpu-node-pools.yaml into Node objects (with status) for kwok to manage."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import yaml

NODE_POOLS_FILE = Path(__file__).with_name("gpu-node-pools.yaml")
KUBE_VERSION = "v1.34.4"
GPU_RESOURCE = "nvidia.com/gpu"
# Same on every node (the kubelet's default pod limit).
PODS_PER_NODE = "110"
EPHEMERAL_STORAGE = "1000Gi"
# Fake InternalIPs (data only, nothing listens there): one /24 per zone.
ZONE_SUBNETS = ("10.100.0.0/24", "10.101.0.0/24", "10.102.0.0/24")


def load_pools(path: Path = NODE_POOLS_FILE) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def build_nodes(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Node manifests for every node of every pool, in file order."""
    region: str = spec["region"]
    blocks: dict[str, list[str]] = spec["network_blocks"]
    taint = dict(spec["gpu_taint"])
    zones: dict[str, ipaddress.IPv4Network] = {}
    ips: dict[str, int] = {}
    nodes = []
    for pool in spec["pools"]:
        gpu = pool.get("gpu")
        arch = pool.get("arch", "amd64")
        for index, node in enumerate(pool["nodes"]):
            name = f"{pool['name']}-{index}"
            zone = node["zone"]
            if zone not in zones:
                if len(zones) == len(ZONE_SUBNETS):
                    raise ValueError(f"node {name}: more than {len(ZONE_SUBNETS)} zones")
                zones[zone] = ipaddress.IPv4Network(ZONE_SUBNETS[len(zones)])
            ips[zone] = ips.get(zone, 9) + 1
            address = str(zones[zone][ips[zone]])
            if node["block"] not in blocks:
                raise ValueError(f"node {name}: unknown network block {node['block']!r}")
            labels = {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": arch,
                "node.kubernetes.io/instance-type": pool["instance_type"],
                "topology.kubernetes.io/region": region,
                "topology.kubernetes.io/zone": zone,
                "eks.amazonaws.com/nodegroup": pool["name"],
                "type": "kwok",
            }
            for layer, block_id in enumerate(blocks[node["block"]], start=1):
                labels[f"topology.k8s.aws/network-node-layer-{layer}"] = block_id
            resources = {
                "cpu": str(pool["cpu"]),
                "memory": str(pool["memory"]),
                "pods": PODS_PER_NODE,
                "ephemeral-storage": EPHEMERAL_STORAGE,
            }
            taints = []
            if gpu:
                major, minor = str(gpu["compute"]).split(".")
                labels |= {
                    "nvidia.com/gpu.present": "true",
                    "nvidia.com/gpu.product": gpu["product"],
                    "nvidia.com/gpu.count": str(gpu["count"]),
                    "nvidia.com/gpu.memory": str(gpu["memory"]),
                    "nvidia.com/gpu.family": gpu["family"],
                    "nvidia.com/gpu.compute.major": major,
                    "nvidia.com/gpu.compute.minor": minor,
                    "nvidia.com/gpu.machine": pool["instance_type"],
                }
                if "clique" in node:
                    labels["nvidia.com/gpu.clique"] = node["clique"]
                resources[GPU_RESOURCE] = str(gpu["count"])
                taints.append(taint)
            nodes.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "labels": labels,
                        # kwok's conventional marker; it manages all nodes here anyway.
                        "annotations": {"kwok.x-k8s.io/node": "fake"},
                    },
                    "spec": {"taints": taints},
                    "status": {
                        "capacity": resources,
                        "allocatable": dict(resources),
                        "addresses": [
                            {"type": "InternalIP", "address": address},
                            {"type": "Hostname", "address": name},
                        ],
                        "nodeInfo": {
                            "architecture": arch,
                            "operatingSystem": "linux",
                            "kubeletVersion": KUBE_VERSION,
                            "kubeProxyVersion": KUBE_VERSION,
                        },
                    },
                }
            )
    return nodes
