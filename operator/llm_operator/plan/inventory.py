"""The GPU inventory: what each node offers, kept from a Node watch with only the fields planning uses.

A Node object is tens of kilobytes (images, conditions, managed fields); the inventory keeps one
small record per node, so thousands of nodes cost little memory, and `upsert` says whether
anything planning reads changed, so the operator re-plans only then.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from llm_operator import labels as L
from llm_operator.plan.gpus import PRODUCTS


@dataclass(frozen=True)
class LabelKeys:
    """Where locality lives; AWS defaults, GKE's block label as fallback."""

    zone: str = L.ZONE
    network_block: tuple[str, ...] = (
        "topology.k8s.aws/network-node-layer-3",
        "cloud.google.com/gce-topology-block",
    )


@dataclass(frozen=True)
class GpuNode:
    name: str
    product: str
    gpus: int  # allocatable nvidia.com/gpu
    memory_mib: int
    compute_capability: tuple[int, int]
    clique: str | None
    zone: str | None
    block: str | None
    schedulable: bool


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return default


def gpu_node(node: dict[str, Any], keys: LabelKeys) -> GpuNode | None:
    meta = node.get("metadata", {})
    labels = meta.get("labels") or {}
    product = labels.get(L.GPU_PRODUCT)
    if not product:
        return None
    known = PRODUCTS.get(product)
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    gpus = _int(allocatable.get(L.GPU_RESOURCE), 0)
    major, minor = labels.get(L.GPU_CC_MAJOR), labels.get(L.GPU_CC_MINOR)
    cc = (_int(major), _int(minor)) if major is not None else (known.compute_capability if known else (0, 0))
    memory = _int(labels.get(L.GPU_MEMORY), known.memory_mib if known else 0)
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = all(c.get("status") == "True" for c in conditions if c.get("type") == "Ready")
    block = next((labels[k] for k in keys.network_block if k in labels), None)
    return GpuNode(
        name=meta["name"],
        product=product,
        gpus=gpus,
        memory_mib=memory,
        compute_capability=cc,
        clique=labels.get(L.GPU_CLIQUE),
        zone=labels.get(keys.zone),
        block=block,
        schedulable=ready and not (node.get("spec") or {}).get("unschedulable", False),
    )


class Inventory:
    def __init__(self, nodes: Iterable[dict[str, Any]] = (), keys: LabelKeys | None = None) -> None:
        self.keys = keys or LabelKeys()
        self.nodes: dict[str, GpuNode] = {}
        for node in nodes:
            self.upsert(node)

    def upsert(self, node: dict[str, Any]) -> bool:
        """Record a node; True if anything planning reads changed (most Node updates change
        nothing it reads: heartbeats, images, conditions of other kinds)."""
        record = gpu_node(node, self.keys)
        name = node["metadata"]["name"]
        if record is None:
            return self.nodes.pop(name, None) is not None
        if self.nodes.get(name) == record:
            return False
        self.nodes[name] = record
        return True

    def remove(self, name: str) -> bool:
        return self.nodes.pop(name, None) is not None

    def of_product(self, product: str) -> list[GpuNode]:
        return [n for n in self.nodes.values() if n.product == product and n.schedulable and n.gpus > 0]

    def products(self) -> list[str]:
        return sorted({n.product for n in self.nodes.values()})
