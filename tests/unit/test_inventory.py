"""GPU inventory: parsing Node objects, change detection, fingerprint, per-product summaries."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from llm_operator.labels import GPU_TOLERATION
from llm_operator.plan.inventory import Inventory, LabelKeys, Taint, tolerates

AWS_BLOCK = "topology.k8s.aws/network-node-layer-3"
GKE_BLOCK = "cloud.google.com/gce-topology-block"


def node(
    name: str,
    product: str = "NVIDIA-H100-80GB-HBM3",
    gpus: int = 8,
    *,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    ready: str | None = "True",
    unschedulable: bool = False,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product, **(labels or {})},
                     "managedFields": [{"manager": "kubelet"}]},
        "spec": {"taints": taints or [], "unschedulable": unschedulable},
        "status": {
            "allocatable": {"cpu": "96", "nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "MemoryPressure", "status": "False"}]
            + ([{"type": "Ready", "status": ready}] if ready is not None else []),
            "images": [{"names": ["nvcr.io/nvidia/tritonserver:25.01"], "sizeBytes": 1 << 34}],
        },
    }  # fmt: skip


GFD = {
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.memory": "81559",
    "nvidia.com/gpu.family": "hopper",
    "nvidia.com/gpu.compute.major": "9",
    "nvidia.com/gpu.compute.minor": "0",
    "nvidia.com/gpu.clique": "uuid.1",
    "topology.kubernetes.io/zone": "us-east-1a",
    AWS_BLOCK: "nn-1",
    GKE_BLOCK: "gke-block",
    "nvidia.com/gfd.timestamp": "1700000000",
    "feature.node.kubernetes.io/cpu-cpuid.AVX512F": "true",
    "pool": "llm",
}


def test_a_node_becomes_a_small_typed_record() -> None:
    inv = Inventory([node("h", labels=GFD, taints=[
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
        {"key": "soft", "effect": "PreferNoSchedule"}])])  # fmt: skip
    n = inv.nodes["h"]
    assert (n.product, n.gpu_count, n.gpus, n.memory_mib, n.compute_capability, n.family) == (
        "NVIDIA-H100-80GB-HBM3", 8, 8, 81559, (9, 0), "hopper"
    )  # fmt: skip
    assert (n.clique, n.zone, n.block_key, n.block) == ("uuid.1", "us-east-1a", AWS_BLOCK, "nn-1")
    assert n.taints == (Taint("nvidia.com/gpu", "present", "NoSchedule"),), (
        "PreferNoSchedule keeps no pod off"
    )
    assert n.ready and not n.unschedulable and n.usable
    # Labels kept for nodeSelector, without the refresh timestamp and NFD's hardware features.
    assert n.labels["pool"] == "llm"
    assert "nvidia.com/gfd.timestamp" not in n.labels
    assert not any(k.startswith("feature.node.kubernetes.io/") for k in n.labels)


def test_label_keys_are_configurable_and_gke_is_the_fallback_block() -> None:
    gke = {k: v for k, v in GFD.items() if k != AWS_BLOCK}
    assert Inventory([node("g", labels=gke)]).nodes["g"].block_key == GKE_BLOCK
    custom = LabelKeys(zone="example.com/rack-zone", network_block=("example.com/spine",))
    n = Inventory(
        [node("c", labels={"example.com/rack-zone": "r1", "example.com/spine": "s7"})], custom
    ).nodes["c"]
    assert (n.zone, n.block_key, n.block) == ("r1", "example.com/spine", "s7")


def test_missing_labels_come_from_the_product_table() -> None:
    inv = Inventory([node("a", "NVIDIA-A10G", 1), node("x", "NVIDIA-X1", 2, labels={
        "nvidia.com/gpu.compute.major": "12", "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/gpu.memory": "97887"})])  # fmt: skip
    a, x = inv.nodes["a"], inv.nodes["x"]
    assert (a.memory_mib, a.compute_capability, a.family) == (23028, (8, 6), "ampere")
    assert (x.memory_mib, x.compute_capability, x.family) == (97887, (12, 0), "blackwell")


def test_readiness_cordon_and_allocatable() -> None:
    inv = Inventory([
        node("no-condition-yet", ready=None), node("not-ready", ready="False"),
        node("cordoned", unschedulable=True), node("no-plugin", gpus=0),
    ])  # fmt: skip
    assert [n for n in inv.nodes if inv.nodes[n].usable] == ["no-condition-yet"]
    assert inv.summaries()["NVIDIA-H100-80GB-HBM3"].nodes == 1


def test_upsert_reports_only_changes_planning_reads() -> None:
    inv = Inventory()
    n = node("h", labels=GFD)
    assert inv.upsert(n) is True
    version, print_ = inv.version, inv.fingerprint()
    noise = copy.deepcopy(n)
    noise["status"]["images"].append({"names": ["x"]})
    noise["status"]["conditions"][0]["status"] = "True"
    noise["metadata"]["labels"]["nvidia.com/gfd.timestamp"] = "1700000060"
    noise["metadata"]["labels"]["feature.node.kubernetes.io/cpu-model.id"] = "143"
    assert inv.upsert(noise) is False
    assert (inv.version, inv.fingerprint()) == (version, print_)
    fewer = copy.deepcopy(n)
    fewer["status"]["allocatable"]["nvidia.com/gpu"] = "7"
    assert inv.upsert(fewer) is True and inv.nodes["h"].gpus == 7
    assert inv.fingerprint() != print_
    assert inv.upsert(n) is True and inv.fingerprint() == print_, "the fingerprint is of state, not history"
    relabeled = copy.deepcopy(n)
    relabeled["metadata"]["labels"]["pool"] = "batch"
    assert inv.upsert(relabeled) is True


def test_nodes_without_gpus_are_not_kept_and_losing_the_product_removes() -> None:
    inv = Inventory([node("h")])
    assert inv.upsert({"metadata": {"name": "cpu", "labels": {}}, "status": {}}) is False
    assert len(inv) == 1
    assert inv.upsert({"metadata": {"name": "h", "labels": {}}}) is True
    assert len(inv) == 0 and inv.remove("h") is False
    assert inv.fingerprint() == Inventory().fingerprint()


def test_fingerprint_ignores_order_and_follows_removal() -> None:
    nodes = [node(f"n{i}", gpus=i + 1) for i in range(5)]
    forward, backward = Inventory(nodes), Inventory(reversed(nodes))
    assert forward.fingerprint() == backward.fingerprint()
    assert forward.remove("n3") is True
    assert forward.fingerprint() == Inventory(nodes[:3] + nodes[4:]).fingerprint()


def test_summaries_aggregate_sizes_cliques_blocks_and_zones() -> None:
    def gb200(name: str, gpus: int, clique: str, block: str, zone: str) -> dict[str, Any]:
        return node(name, "NVIDIA-GB200", gpus, labels={"nvidia.com/gpu.clique": clique, AWS_BLOCK: block,
                                                        "topology.kubernetes.io/zone": zone})  # fmt: skip

    inv = Inventory([
        gb200("g0", 4, "c.1", "b1", "z1"), gb200("g1", 4, "c.1", "b1", "z1"),
        gb200("g2", 4, "c.1", "b2", "z1"), gb200("g3", 4, "c.2", "b2", "z2"),
        gb200("g4", 2, "c.2", "b2", "z2"),
    ])  # fmt: skip
    s = inv.summaries()["NVIDIA-GB200"]
    assert (s.nodes, s.total_gpus, s.largest, s.largest_node) == (5, 18, 4, "g3")
    assert dict(s.cliques) == {"c.1": 12, "c.2": 6}
    assert dict(s.blocks) == {"b1": 2, "b2": 3} and dict(s.zones) == {"z1": 3, "z2": 2}
    assert (s.block_key, s.zone_key, s.memory_mib, s.compute_capability) == (
        AWS_BLOCK, "topology.kubernetes.io/zone", 189471, (10, 0)
    )  # fmt: skip
    assert s.nodes_with(4) == 4 and s.nodes_with(2) == 5 and s.nodes_with(8) == 0
    assert (s.nodes_with(4, "clique"), s.best_domain(4, "clique")) == (3, "c.1")
    assert (s.nodes_with(2, "block"), s.best_domain(2, "block")) == (3, "b2")
    assert (s.nodes_with(4, "block"), s.best_domain(4, "block")) == (2, "b1"), "ties: smallest name"
    assert s.pod_slots(4) == 4 and s.pod_slots(2) == 9 and s.pod_slots(1) == 18


def test_summaries_respect_taints_and_node_selector_and_are_cached_until_a_change() -> None:
    dedicated = [{"key": "dedicated", "value": "llm", "effect": "NoSchedule"}]
    inv = Inventory([
        node("open", labels={"pool": "a"}), node("tainted", labels={"pool": "b"}, taints=dedicated),
    ])  # fmt: skip
    assert inv.summaries(tolerations=[GPU_TOLERATION])["NVIDIA-H100-80GB-HBM3"].nodes == 1
    tolerant = [GPU_TOLERATION, {"key": "dedicated", "operator": "Equal", "value": "llm"}]
    assert inv.summaries(tolerations=tolerant)["NVIDIA-H100-80GB-HBM3"].nodes == 2
    assert inv.summaries({"pool": "b"}, tolerant)["NVIDIA-H100-80GB-HBM3"].largest_node == "tainted"
    assert inv.summaries({"pool": "c"}, tolerant) == {}
    # A selector on a label the inventory does not keep is assumed to match.
    assert inv.summaries({"feature.node.kubernetes.io/pci-10de.present": "true"}, tolerant)
    first = inv.summaries(tolerations=tolerant)
    assert inv.summaries(tolerations=tolerant) is first
    inv.upsert(node("third"))
    assert inv.summaries(tolerations=tolerant)["NVIDIA-H100-80GB-HBM3"].nodes == 3


def test_left_out_says_why() -> None:
    inv = Inventory([
        node("a", ready="False"), node("b", unschedulable=True), node("c", gpus=0),
        node("d", taints=[{"key": "dedicated", "value": "x", "effect": "NoExecute"}]),
        node("e", labels={"pool": "other"}), node("f", "NVIDIA-L4"),
    ])  # fmt: skip
    assert inv.left_out("NVIDIA-H100-80GB-HBM3", {"pool": "other"}, [GPU_TOLERATION]) == (
        "1 cordoned; 1 no allocatable nvidia.com/gpu; 1 not Ready; "
        "1 taint dedicated=x:NoExecute not tolerated"
    )
    assert inv.left_out("NVIDIA-L4", None, [GPU_TOLERATION]) == ""


def test_toleration_matching() -> None:
    taint = Taint("nvidia.com/gpu", "present", "NoSchedule")
    assert tolerates([GPU_TOLERATION], taint)
    assert tolerates([{"operator": "Exists"}], taint), "empty key with Exists tolerates everything"
    assert not tolerates([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}], taint)
    assert tolerates([{"key": "nvidia.com/gpu", "value": "present"}], taint), "operator defaults to Equal"
    assert not tolerates([{"key": "nvidia.com/gpu", "value": "absent"}], taint)


@st.composite
def node_events(draw: st.DrawFn) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for _ in range(draw(st.integers(1, 25))):
        name = f"n{draw(st.integers(0, 6))}"
        if draw(st.booleans()) and draw(st.booleans()):
            events.append(("DELETED", node(name)))
            continue
        labels = {
            AWS_BLOCK: draw(st.sampled_from(["b0", "b1"])),
            "topology.kubernetes.io/zone": draw(st.sampled_from(["z0", "z1"])),
            "nvidia.com/gpu.clique": draw(st.sampled_from(["c0", "c1"])),
        }
        product = draw(st.sampled_from(["NVIDIA-GB200", "NVIDIA-L40S", ""]))
        events.append(("MODIFIED", node(name, product, draw(st.integers(0, 8)), labels=labels,
                                        ready=draw(st.sampled_from(["True", "False"])))))  # fmt: skip
    return events


@settings(max_examples=40, deadline=None)
@given(events=node_events())
def test_incremental_updates_equal_a_fresh_build(events: list[tuple[str, dict[str, Any]]]) -> None:
    live = Inventory()
    final: dict[str, dict[str, Any]] = {}
    for kind, obj in events:
        name = obj["metadata"]["name"]
        version = live.version
        changed = live.remove(name) if kind == "DELETED" else live.upsert(obj)
        assert changed == (live.version != version)
        if kind == "DELETED":
            final.pop(name, None)
        else:
            final[name] = obj
    fresh = Inventory(final.values())
    assert live.nodes == fresh.nodes
    assert live.fingerprint() == fresh.fingerprint()
    assert live.summaries(None, [GPU_TOLERATION]) == fresh.summaries({}, [GPU_TOLERATION])
