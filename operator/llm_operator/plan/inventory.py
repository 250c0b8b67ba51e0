"""The GPU inventory: what each node offers, kept from a Node watch with only what planning reads.

A Node object is tens of kilobytes (images, conditions, managed fields); the inventory keeps one
small record per GPU node, so thousands of nodes cost little memory. `upsert` says whether
anything planning reads changed (heartbeats and image lists do not), `fingerprint()` identifies
the planning-relevant state in O(1), and per-product summaries are computed once per change and
per (nodeSelector, tolerations) pair, so planning at 1,000 nodes reads a handful of aggregates.

Labels read (keys configurable through LabelKeys where clouds differ):
  nvidia.com/gpu.product, .count, .memory (MiB), .family, .compute.major/.minor, .clique
  nvidia.com/cuda.driver-version.major/.minor/.revision, else nvidia.com/cuda.driver.major/... (older GFD)
  topology.kubernetes.io/zone
  network block: topology.k8s.aws/network-node-layer-3 (EKS), else cloud.google.com/gce-topology-block (GKE)
Other labels are kept for spec.placement.nodeSelector, except NFD's hardware-feature labels
(hundreds per node; a selector on them is assumed to match) and GFD's refresh timestamp.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import astuple, dataclass
from typing import Any, Literal

from llm_operator import labels as L
from llm_operator.api.v1alpha1 import POWERS_OF_TWO
from llm_operator.plan import gpus
from llm_operator.plan.driver import DriverFloor, Version, driver_of

Scope = Literal["clique", "block", "zone"]  # a domain a multi-node group must stay inside
UNBOUNDED = 1 << 30  # planning without an inventory: node counts are not the limit
UNKEPT_LABEL_PREFIXES = ("feature.node.kubernetes.io/",)
VOLATILE_LABELS = frozenset({"nvidia.com/gfd.timestamp"})
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True)
class LabelKeys:
    """Where locality lives; the first network-block key a node carries wins."""

    zone: str = L.ZONE
    network_block: tuple[str, ...] = (
        "topology.k8s.aws/network-node-layer-3",
        "cloud.google.com/gce-topology-block",
    )


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


def tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Taint) -> bool:
    """Kubernetes toleration matching (v1.Toleration.ToleratesTaint)."""
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.effect:
            continue
        if t.get("operator", "Equal") == "Exists":
            if not t.get("key") or t["key"] == taint.key:
                return True
        elif t.get("key") == taint.key and (t.get("value") or "") == taint.value:
            return True
    return False


@dataclass(frozen=True)
class GpuNode:
    name: str
    product: str
    gpu_count: int  # nvidia.com/gpu.count (GPUs present; 0 when unlabeled)
    gpus: int  # allocatable nvidia.com/gpu: what pods can request
    memory_mib: int
    compute_capability: tuple[int, int]
    family: str
    clique: str | None
    zone: str | None
    block_key: str | None  # which LabelKeys.network_block key the block came from
    block: str | None
    taints: tuple[Taint, ...]  # NoSchedule/NoExecute only: the ones that keep pods off
    unschedulable: bool
    ready: bool
    driver: Version | None  # the CUDA driver, (580, 95, 5); None: GFD did not label it
    driver_version: str | None  # as written, for messages (580.95.05)
    labels: Mapping[str, str]

    @property
    def usable(self) -> bool:
        return self.ready and not self.unschedulable and self.gpus > 0

    def meets(self, driver_floor: DriverFloor | None) -> bool:
        """A node whose driver GFD did not label meets every floor: there is nothing to check."""
        return driver_floor is None or driver_floor.admits(self.product, self.driver)

    def admits(
        self,
        node_selector: Mapping[str, str],
        tolerations: Sequence[Mapping[str, Any]],
        driver_floor: DriverFloor | None = None,
    ) -> bool:
        return (
            self.usable
            and all(tolerates(tolerations, t) for t in self.taints)
            and all(_selects(self.labels, k, v) for k, v in node_selector.items())
            and self.meets(driver_floor)
        )


def _selects(labels: Mapping[str, str], key: str, value: str) -> bool:
    return labels.get(key) == value or key.startswith(UNKEPT_LABEL_PREFIXES)


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return default


def gpu_node(node: Mapping[str, Any], keys: LabelKeys) -> GpuNode | None:
    """The planning record of a Node object; None for nodes without a GPU product label."""
    meta = node.get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    product = labels.get(L.GPU_PRODUCT)
    if not product:
        return None
    known = gpus.lookup(product)
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    if L.GPU_CC_MAJOR in labels:
        cc = (_int(labels[L.GPU_CC_MAJOR]), _int(labels.get(L.GPU_CC_MINOR)))
    else:
        cc = known.compute_capability if known else (0, 0)
    # No Ready condition yet (kwok, hand-written node files): counted as Ready.
    conditions = status.get("conditions") or ()
    ready = next((c.get("status") == "True" for c in conditions if c.get("type") == "Ready"), True)
    block_key = next((k for k in keys.network_block if k in labels), None)
    taints = tuple(
        Taint(str(t.get("key", "")), str(t.get("value") or ""), str(t["effect"]))
        for t in spec.get("taints") or ()
        if t.get("effect") in BLOCKING_EFFECTS
    )
    kept = {
        sys.intern(k): sys.intern(v)
        for k, v in labels.items()
        if k not in VOLATILE_LABELS and not k.startswith(UNKEPT_LABEL_PREFIXES)
    }
    driver, driver_version = driver_of(labels)
    return GpuNode(
        name=meta["name"],
        product=product,
        gpu_count=_int(labels.get(L.GPU_COUNT)),
        gpus=_int((status.get("allocatable") or {}).get(L.GPU_RESOURCE)),
        memory_mib=_int(labels.get(L.GPU_MEMORY), known.memory_mib if known else 0),
        compute_capability=cc,
        family=labels.get(L.GPU_FAMILY) or (known.family if known else gpus.family_of(cc)),
        clique=labels.get(L.GPU_CLIQUE),
        zone=labels.get(keys.zone),
        block_key=block_key,
        block=labels[block_key] if block_key else None,
        taints=taints,
        unschedulable=bool(spec.get("unschedulable", False)),
        ready=ready,
        driver=driver,
        driver_version=driver_version,
        labels=kept,
    )


def _digest(record: GpuNode) -> int:
    canonical = json.dumps(
        [
            record.name, record.product, record.gpu_count, record.gpus, record.memory_mib,
            record.compute_capability, record.family, record.clique, record.zone, record.block_key,
            record.block, [str(t) for t in record.taints], record.unschedulable, record.ready,
            record.driver, record.driver_version, sorted(record.labels.items()),
        ]
    )  # fmt: skip
    return int.from_bytes(hashlib.blake2b(canonical.encode(), digest_size=16).digest(), "big")


@dataclass(frozen=True)
class ProductSummary:
    """What one GPU product offers the pods of one spec (nodes they may use), pre-aggregated."""

    product: str
    memory_mib: int  # smallest among the nodes: plans must fit every one of them
    compute_capability: tuple[int, int]
    family: str
    nvlink: bool  # intra-node NVLink (from the product table; unknown products assumed NVLink)
    nodes: int
    total_gpus: int
    largest: int  # most allocatable GPUs on one node
    largest_node: str
    block_key: str | None  # the network-block label these nodes carry (None: none carries one)
    zone_key: str | None  # the zone label, None when no node has it
    cliques: Mapping[str, int]  # clique -> allocatable GPUs
    blocks: Mapping[str, int]  # block -> nodes
    zones: Mapping[str, int]  # zone -> nodes
    # (pod GPUs, scope) -> (most nodes with >= that many GPUs inside one domain, that domain)
    within: Mapping[tuple[int, Scope | None], tuple[int, str]]
    slots: Mapping[int, int]  # pod GPUs -> how many such pods the nodes hold
    offline: bool = False  # from the product table, not from nodes

    def nodes_with(self, gpus: int, scope: Scope | None = None) -> int:
        """Most nodes with >= `gpus` allocatable GPUs inside one domain of `scope` (None: anywhere)."""
        return self.within.get((gpus, scope), (0, ""))[0]

    def best_domain(self, gpus: int, scope: Scope) -> str:
        return self.within.get((gpus, scope), (0, ""))[1]

    def pod_slots(self, gpus: int) -> int:
        return self.slots.get(gpus, 0)

    @classmethod
    def of_nodes(cls, product: str, nodes: Sequence[GpuNode], keys: LabelKeys) -> ProductSummary:
        known = gpus.lookup(product)
        largest = max(nodes, key=lambda n: (n.gpus, n.name))
        domains: dict[Scope, dict[str, list[int]]] = {"clique": {}, "block": {}, "zone": {}}
        for n in nodes:
            if n.clique is not None:
                domains["clique"].setdefault(n.clique, []).append(n.gpus)
            if n.block is not None:
                domains["block"].setdefault(n.block, []).append(n.gpus)
            if n.zone is not None:
                domains["zone"].setdefault(n.zone, []).append(n.gpus)
        within: dict[tuple[int, Scope | None], tuple[int, str]] = {}
        slots: dict[int, int] = {}
        for g in (p for p in POWERS_OF_TWO if p <= largest.gpus):
            within[(g, None)] = (sum(n.gpus >= g for n in nodes), "")
            slots[g] = sum(n.gpus // g for n in nodes)
            for scope, by_value in domains.items():
                counts = sorted(((sum(x >= g for x in xs), v) for v, xs in by_value.items()), reverse=True)
                if counts and counts[0][0] > 0:
                    # Ties go to the smallest domain name, so messages are deterministic.
                    top = counts[0][0]
                    within[(g, scope)] = (top, min(v for c, v in counts if c == top))
        return cls(
            product=product,
            memory_mib=min(n.memory_mib for n in nodes),
            compute_capability=min(n.compute_capability for n in nodes),
            family=largest.family,
            nvlink=known.nvlink if known else True,
            nodes=len(nodes),
            total_gpus=sum(n.gpus for n in nodes),
            largest=largest.gpus,
            largest_node=largest.name,
            block_key=next((n.block_key for n in sorted(nodes, key=lambda n: n.name) if n.block_key), None),
            zone_key=keys.zone if domains["zone"] else None,
            cliques={c: sum(by) for c, by in sorted(domains["clique"].items())},
            blocks={b: len(by) for b, by in sorted(domains["block"].items())},
            zones={z: len(by) for z, by in sorted(domains["zone"].items())},
            within=within,
            slots=slots,
        )

    @classmethod
    def typical(cls, gpu: gpus.GpuProduct, keys: LabelKeys) -> ProductSummary:
        """Planning without a cluster: typical nodes, as many as needed, blocks and zones assumed."""
        per_node = gpu.gpus_per_node
        clique_nodes = gpu.nvlink_domain_gpus // per_node
        within: dict[tuple[int, Scope | None], tuple[int, str]] = {}
        for g in (p for p in POWERS_OF_TWO if p <= per_node):
            for scope in (None, "block", "zone"):
                within[(g, scope)] = (UNBOUNDED, "")
            if clique_nodes:
                within[(g, "clique")] = (clique_nodes, "")
        return cls(
            product=gpu.name,
            memory_mib=gpu.memory_mib,
            compute_capability=gpu.compute_capability,
            family=gpu.family,
            nvlink=gpu.nvlink,
            nodes=UNBOUNDED,
            total_gpus=UNBOUNDED,
            largest=per_node,
            largest_node="a typical node",
            block_key=keys.network_block[0],
            zone_key=keys.zone,
            cliques={},
            blocks={},
            zones={},
            within=within,
            slots=dict.fromkeys((g for g, _ in within), UNBOUNDED),
            offline=True,
        )


class Inventory:
    """GPU nodes by name, updated incrementally from Node watch events."""

    MAX_CACHED_FILTERS = 64

    def __init__(self, nodes: Iterable[Mapping[str, Any]] = (), keys: LabelKeys | None = None) -> None:
        self.keys = keys or LabelKeys()
        self.nodes: dict[str, GpuNode] = {}
        self.version = 0  # bumped on every change planning can see
        self._digests: dict[str, int] = {}
        self._fingerprint = 0
        self._summaries: dict[str, dict[str, ProductSummary]] = {}
        for node in nodes:
            self.upsert(node)

    def __len__(self) -> int:
        return len(self.nodes)

    def upsert(self, node: Mapping[str, Any]) -> bool:
        """Record an added or modified Node; True if anything planning reads changed."""
        record = gpu_node(node, self.keys)
        name = node["metadata"]["name"]
        if record is None:
            return self.remove(name)  # the GPU labels went away (or never were)
        if self.nodes.get(name) == record:
            return False
        digest = _digest(record)
        self._fingerprint ^= self._digests.get(name, 0) ^ digest
        self._digests[name] = digest
        self.nodes[name] = record
        self._changed()
        return True

    def remove(self, name: str) -> bool:
        if self.nodes.pop(name, None) is None:
            return False
        self._fingerprint ^= self._digests.pop(name)
        self._changed()
        return True

    def _changed(self) -> None:
        self.version += 1
        self._summaries.clear()

    def fingerprint(self) -> str:
        """Identifies everything planning reads: equal fingerprints give equal plans. Order
        independent and O(1): the XOR of one digest per node record."""
        return f"{self._fingerprint:032x}"

    def products(self) -> list[str]:
        """Every GPU product a node reports, usable or not."""
        return sorted({n.product for n in self.nodes.values()})

    def summaries(
        self,
        node_selector: Mapping[str, str] | None = None,
        tolerations: Sequence[Mapping[str, Any]] = (),
        driver_floor: DriverFloor | None = None,
    ) -> dict[str, ProductSummary]:
        """Per product, the nodes that pods with this nodeSelector and these tolerations may use,
        leaving out nodes whose CUDA driver `driver_floor` does not admit (None: no floor)."""
        selector = node_selector or {}
        floor = astuple(driver_floor) if driver_floor else None
        key = json.dumps([sorted(selector.items()), list(tolerations), floor], sort_keys=True)
        cached = self._summaries.get(key)
        if cached is not None:
            return cached
        by_product: dict[str, list[GpuNode]] = {}
        for n in self.nodes.values():
            if n.admits(selector, tolerations, driver_floor):
                by_product.setdefault(n.product, []).append(n)
        result = {p: ProductSummary.of_nodes(p, nodes, self.keys) for p, nodes in sorted(by_product.items())}
        if len(self._summaries) >= self.MAX_CACHED_FILTERS:
            self._summaries.clear()
        self._summaries[key] = result
        return result

    def left_out(
        self,
        product: str,
        node_selector: Mapping[str, str] | None,
        tolerations: Sequence[Mapping[str, Any]],
        driver_floor: DriverFloor | None = None,
    ) -> str:
        """Why nodes of `product` cannot take the pods ('' when none are left out), for messages."""
        selector = node_selector or {}
        reasons: dict[str, int] = {}
        for n in self.nodes.values():
            if n.product != product or n.admits(selector, tolerations, driver_floor):
                continue
            untolerated = [str(t) for t in n.taints if not tolerates(tolerations, t)]
            if not n.ready:
                why = "not Ready"
            elif n.unschedulable:
                why = "cordoned"
            elif n.gpus <= 0:
                why = "no allocatable nvidia.com/gpu"
            elif untolerated:
                why = f"taint {', '.join(untolerated)} not tolerated"
            elif not n.meets(driver_floor):
                why = f"CUDA driver {n.driver_version} below the release's floor"
            else:
                why = "not matched by placement.nodeSelector"
            reasons[why] = reasons.get(why, 0) + 1
        return "; ".join(f"{count} {why}" for why, count in sorted(reasons.items()))
