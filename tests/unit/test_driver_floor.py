"""The release's CUDA driver floor against GFD's driver labels: which nodes run a release (its own
driver, or a listed long-term branch on a data-center GPU), which the inventory keeps for
placement, the planner's error and warning, the pods' and build Jobs' node affinity, and which
release sets the floor (none for the CPU backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator import releases
from llm_operator.api.v1alpha1 import LLMDeployment
from llm_operator.controller.status.status import Observation, reduce
from llm_operator.desired import plan_for, serving_release
from llm_operator.engine import build_job
from llm_operator.images import Images
from llm_operator.plan.driver import DriverFloor
from llm_operator.plan.floor import plan_within_floor
from llm_operator.plan.inventory import Inventory
from llm_operator.plan.types import PlanningError
from llm_operator.render.placement import pod_scheduling

from tests.unit.test_planner import A100_80, H100, node, spec

REPO = Path(__file__).resolve().parents[2]
R2512 = releases.BY_TRTLLM["1.1.0"]  # floor 580
R2510 = releases.BY_TRTLLM["1.0.0"]  # floor 575
IMAGES = Images("runtime:1", "cpu-runtime:1", "", "1.1.0", launcher="launcher:1", fetch="fetch:1")
SMALL = "meta-llama/Meta-Llama-3-8B-Instruct"
CURRENT = "nvidia.com/cuda.driver-version"
OLDER = "nvidia.com/cuda.driver"
GEFORCE = "NVIDIA-GeForce-RTX-4090"  # a consumer GPU: not in the catalogue
GEFORCE_4090 = (GEFORCE, 24564, (8, 9))


def driver(version: str, *, older_names: bool = True, current_names: bool = True) -> dict[str, str]:
    """GFD's driver labels: v0.15.0 on write both sets, older GFD the older names only."""
    major, minor, rev = version.split(".")
    labels: dict[str, str] = {}
    if current_names:
        labels |= {f"{CURRENT}.major": major, f"{CURRENT}.minor": minor, f"{CURRENT}.revision": rev,
                   f"{CURRENT}.full": version}  # fmt: skip
    if older_names:
        labels |= {f"{OLDER}.major": major, f"{OLDER}.minor": minor, f"{OLDER}.rev": rev}
    return labels


def planning_error(s: Any, inventory: Inventory, release: releases.Release | None = R2512) -> PlanningError:
    with pytest.raises(PlanningError) as e:
        plan_within_floor(s, inventory, 1, release)
    return e.value


# --- inventory ---------------------------------------------------------------------------------


def test_the_driver_comes_from_the_current_labels_then_the_older_ones() -> None:
    inv = Inventory([
        node("new", H100, 8, **driver("580.95.05")),
        node("old-gfd", H100, 8, **driver("570.86.15", current_names=False)),
        # Both sets present and (never with GFD) disagreeing: the current names win.
        node("both", H100, 8, **driver("550.54.15", current_names=False),
             **driver("580.65.06", older_names=False)),
        node("major-only", H100, 8, **{f"{CURRENT}.major": "570"}),
        node("unlabeled", H100, 8),
        node("garbled", H100, 8, **{f"{OLDER}.major": "r570"}),
    ])  # fmt: skip
    got = {n.name: (n.driver, n.driver_version) for n in inv.nodes.values()}
    assert got == {
        "new": ((580, 95, 5), "580.95.05"),
        "old-gfd": ((570, 86, 15), "570.86.15"),
        "both": ((580, 65, 6), "580.65.06"),
        "major-only": ((570,), "570"),
        "unlabeled": (None, None),
        "garbled": (None, None),
    }


def test_a_data_center_gpu_runs_a_release_on_a_listed_long_term_branch_at_its_minimum() -> None:
    floor = DriverFloor.of(R2512)  # 580 on any GPU; 535.86, 550.54, 570.26 on data-center GPUs
    admitted = {
        (H100[0], (580, 95, 5)): "the release's own driver",
        (H100[0], (570, 86, 15)): "R570 above its minimum: forward compatibility",
        (H100[0], (570,)): "R570 by major only: the minimum cannot be checked",
        (A100_80[0], (535, 86, 10)): "R535 at its minimum",
        ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", (550, 54, 15)): "a MIG slice of a data-center GPU",
        (GEFORCE, (580, 65, 6)): "a consumer GPU on the release's own driver",
        (GEFORCE, None): "an unknown driver is not checked",
    }
    refused = {
        (H100[0], (570, 20, 1)): "R570 below its minimum",
        (H100[0], (545, 23, 8)): "R545 is not a listed branch",
        (A100_80[0], (470, 256, 2)): "R470 is not a listed branch",
        (GEFORCE, (570, 86, 15)): "forward compatibility is for data-center GPUs",
        (GEFORCE, (575,)): "a consumer GPU below the release's driver",
    }
    assert {k: floor.admits(*k) for k in admitted} == dict.fromkeys(admitted, True)
    assert {k: floor.admits(*k) for k in refused} == dict.fromkeys(refused, False)
    assert str(floor) == "580, or on a data-center GPU 535.86+ (R535), 550.54+ (R550) or 570.26+ (R570)"
    # Node affinity says the lowest major any branch allows; no row allows lower than any other, so
    # the term only ever keeps pods off nodes that run no release at all (plan/floor.py).
    assert {DriverFloor.of(r).coarse for r in releases.RELEASES} == {535}
    assert DriverFloor.of(releases.BY_TRTLLM["1.2.1"]).admits(H100[0], (580, 95, 5)), "590 or R580"


def test_nodes_the_floor_refuses_leave_the_summaries_and_unknown_drivers_stay() -> None:
    inv = Inventory([
        node("ok", H100, 8, **driver("580.95.05")),
        node("r570", H100, 8, **driver("570.86.15")),
        node("old", H100, 8, **driver("545.23.08")),
        node("unknown", H100, 8),
    ])  # fmt: skip
    tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    floor = DriverFloor.of(R2512)
    assert inv.summaries({}, tolerations)[H100[0]].nodes == 4, "no floor: every node"
    assert inv.summaries({}, tolerations, floor)[H100[0]].nodes == 3
    assert inv.summaries({}, tolerations, DriverFloor.of(R2510))[H100[0]].nodes == 3
    assert (
        inv.left_out(H100[0], {}, tolerations, floor) == "1 CUDA driver 545.23.08 below the release's floor"
    )
    before = inv.fingerprint()
    assert inv.upsert(node("old", H100, 8, **driver("580.95.05"))), "a driver upgrade is a planning change"
    assert inv.fingerprint() != before and inv.summaries({}, tolerations, floor)[H100[0]].nodes == 4


# --- planner -----------------------------------------------------------------------------------


def test_only_refused_drivers_refuse_with_the_nodes_their_drivers_and_the_way_out() -> None:
    inv = Inventory([node(f"g{i}", GEFORCE_4090, 8, **driver("575.57.08")) for i in range(7)])
    e = planning_error(spec(SMALL), inv)
    assert e.reason == "DriverBelowReleaseFloor"
    assert e.message == (
        "no node can host meta-llama/Meta-Llama-3-8B-Instruct within the CUDA driver floor: tritonserver "
        "25.12 (TensorRT-LLM 1.1.0) needs driver 580, or on a data-center GPU 535.86+ (R535), 550.54+ (R550) "
        "or 570.26+ (R570), and the nodes that could host it have older ones: g0 (driver 575.57.08), g1 "
        "(driver 575.57.08), g2 (driver 575.57.08), g3 (driver 575.57.08), g4 (driver 575.57.08) and 2 more; "
        "upgrade their NVIDIA driver to 580 or newer, or serve a release their driver runs: tritonserver "
        "25.07 (TensorRT-LLM 0.20.0), tritonserver 25.08 (TensorRT-LLM 0.21.0), tritonserver 25.10 "
        "(TensorRT-LLM 1.0.0) (the chart's operator.runtimeImage and operator.trtllmVersion, or this "
        "deployment's engine.build.tensorrtLlmVersion with runtime.image and engine.build.image)"
    )
    old = Inventory([node("h0", H100, 8, **driver("545.23.08"))])
    assert planning_error(spec(SMALL), old).message.endswith(
        "upgrade their NVIDIA driver to 580 or newer (no release the operator knows runs on their drivers)"
    )
    # The release these drivers run places it.
    assert plan_within_floor(spec(SMALL), inv, 1, R2510).primary.gpu_product == GEFORCE_4090[0]


def test_the_floor_is_named_only_when_it_is_what_keeps_the_spec_off() -> None:
    # Cordoned as well: the driver is not the (only) obstacle, the usual error says what is.
    cordoned = node("h0", H100, 8, **driver("545.23.08"))
    cordoned["spec"]["unschedulable"] = True
    e = planning_error(spec(SMALL, **{"resources.gpu.products": [H100[0]]}), Inventory([cordoned]))
    assert (e.reason, e.message) == (
        "NoMatchingGPUProduct",
        "no schedulable node offers NVIDIA-H100-80GB-HBM3 (NVIDIA-H100-80GB-HBM3: 1 cordoned); the cluster "
        "has NVIDIA-H100-80GB-HBM3",
    )
    # Too few GPUs whatever the driver: that is the reason, and the driver is named as well.
    too_few = Inventory([node("h", H100, 8, **driver("545.23.08"))])
    e = planning_error(spec(**{"parallelism.tensor": 16}), too_few)
    assert e.reason == "InsufficientGPUs"
    assert e.message.endswith(
        "; besides, h (driver 545.23.08) left out: their CUDA driver is older than the 580, or on a "
        "data-center GPU 535.86+ (R535), 550.54+ (R550) or 570.26+ (R570) that tritonserver 25.12 "
        "(TensorRT-LLM 1.1.0) needs; upgrade their NVIDIA driver to use them"
    )
    # A listed product whose only nodes are too old: named with the reason it is left out.
    s = spec(SMALL, **{"resources.gpu.products": [H100[0]]})
    inv = Inventory([node("h", H100, 8, **driver("545.23.08")), node("a", A100_80, 8)])
    assert planning_error(s, inv).reason == "DriverBelowReleaseFloor"


def test_an_h100_on_r570_serves_25_12_and_refused_nodes_are_a_placement_warning() -> None:
    inv = Inventory([
        node("h-r570", H100, 8, **driver("570.86.15")),
        node("h-r545", H100, 8, **driver("545.23.08")),
        node("g-r570", GEFORCE_4090, 8, **driver("570.86.15")),
        node("a-unknown", A100_80, 8),
    ])  # fmt: skip
    plan = plan_within_floor(spec(SMALL), inv, 1, R2512)
    assert plan.primary.gpu_product == H100[0], "the H100 on R570 runs 25.12 by forward compatibility"
    assert plan.warnings == (
        "g-r570 (driver 570.86.15), h-r545 (driver 545.23.08) left out: their CUDA driver is older than the "
        "580, or on a data-center GPU 535.86+ (R535), 550.54+ (R550) or 570.26+ (R570) that tritonserver "
        "25.12 (TensorRT-LLM 1.1.0) needs; upgrade their NVIDIA driver to use them",
    )
    # Nodes of a product the spec does not list are no news to it.
    only_a100 = spec(SMALL, **{"resources.gpu.products": [A100_80[0]]})
    assert plan_within_floor(only_a100, inv, 1, R2512).warnings == ()
    # Without a known release there is no floor: every node is a candidate.
    assert plan_within_floor(spec(SMALL), inv, 1, None).warnings == ()


def test_pools_carry_the_coarse_floor_only_where_a_node_of_their_products_is_below_it() -> None:
    current = [
        node("a-new", A100_80, 8, **driver("580.95.05")),
        node("a-r535", A100_80, 8, **driver("535.86.10")),
    ]
    s = spec(SMALL, **{"resources.gpu.products": [A100_80[0]]})
    # Every node at 535 or newer: a term would keep no node off, so the template stays as it was.
    assert plan_within_floor(s, Inventory(current), 1, R2512).primary.driver_floor is None
    assert plan_within_floor(s, None, 1, R2512).primary.driver_floor is None, "no inventory: nothing below"
    ancient = node("a-r470", A100_80, 8, **driver("470.256.02"))
    ancient["spec"]["unschedulable"] = True  # cordoned today, maybe not tomorrow
    assert plan_within_floor(s, Inventory([*current, ancient]), 1, R2512).primary.driver_floor == 535
    # A node below it of a product the pool does not use changes nothing.
    other = node("h-r470", H100, 8, **driver("470.256.02"))
    assert plan_within_floor(s, Inventory([*current, other]), 1, R2512).primary.driver_floor is None


def test_a_refusal_is_stalled_with_its_reason() -> None:
    e = planning_error(spec(SMALL), Inventory([node("h0", H100, 8, **driver("545.23.08"))]))
    status, events = reduce(Observation(generation=1, plan=e, selector="s"), None, "2026-01-01T00:00:00Z")
    stalled = next(c for c in status["conditions"] if c["type"] == "Stalled")
    assert (stalled["status"], stalled["reason"]) == ("True", "DriverBelowReleaseFloor")
    assert any(e.type == "Warning" and "h0 (driver 545.23.08)" in e.message for e in events)


# --- which release, and what pods and build Jobs get ---------------------------------------------


def example(name: str, **build: Any) -> LLMDeployment:
    doc = yaml.safe_load((REPO / "examples" / f"{name}.yaml").read_text())
    doc["metadata"].update(namespace="default", uid="uid-1")
    if build:
        doc["spec"]["engine"]["build"].update(build)
    return LLMDeployment.model_validate(doc)


def test_the_release_of_the_served_tensorrt_llm_sets_the_floor_and_cpu_has_none() -> None:
    ld = example("llama3-70b-fp8")
    assert serving_release(ld, IMAGES) is R2512
    assert serving_release(example("llama3-70b-fp8", tensorrtLlmVersion="1.0.0"), IMAGES) is R2510
    unknown = example("llama3-70b-fp8", tensorrtLlmVersion="9.9.9", image="mine:1")
    assert serving_release(unknown, IMAGES) is None, "a version the table lacks: no floor"
    ancient = Inventory(
        [node("h0", H100, 8, **driver("580.95.05")), node("h1", H100, 8, **driver("470.256.02"))]
    )
    assert plan_for(ld, ancient, IMAGES).primary.driver_floor == 535
    assert plan_for(ld, ancient).primary.driver_floor is None, "no images: planned without a floor"
    cpu = plan_for(example("cpu-reference"), ancient, IMAGES)
    assert cpu.primary.driver_floor is None and cpu.warnings == ()


def required_terms(pod: dict[str, Any]) -> list[list[dict[str, Any]]]:
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return [t["matchExpressions"] for t in terms["nodeSelectorTerms"]]


def test_pods_and_build_jobs_keep_off_nodes_below_the_floor_but_not_off_unlabeled_ones() -> None:
    s = spec(SMALL)
    inv = Inventory([node("h0", H100, 8, **driver("580.95.05")), node("h1", H100, 8, **driver("470.256.02"))])
    pool = plan_within_floor(s, inv, 1, R2512).primary
    product = {"key": "nvidia.com/gpu.product", "operator": "In", "values": list(pool.allowed_products)}
    absent = {"key": f"{CURRENT}.major", "operator": "DoesNotExist"}
    want: list[list[dict[str, Any]]] = [
        [product, {"key": f"{CURRENT}.major", "operator": "Gt", "values": ["534"]}],
        [product, absent, {"key": f"{OLDER}.major", "operator": "Gt", "values": ["534"]}],
        [product, absent, {"key": f"{OLDER}.major", "operator": "DoesNotExist"}],
    ]
    job = build_job("d", "ns", s, pool, "k", image="b", images=IMAGES, owner={})
    assert required_terms(job["spec"]["template"]["spec"]) == want
    assert required_terms(pod_scheduling(s, pool, selector={}, group_selector=None)) == want
    # The coarse floor: 535, the lowest branch any GPU runs 25.12 on; the rest is the planner's.
    admitted = [driver("580.95.05"), driver("570.86.15", older_names=False),
                driver("535.86.10", current_names=False), {}]  # fmt: skip
    refused = [driver("470.256.02"), driver("470.256.02", current_names=False),
               driver("525.147.05", older_names=False)]  # fmt: skip
    gpu = {"nvidia.com/gpu.product": pool.gpu_product}
    assert [matches(want, gpu | labels) for labels in admitted] == [True] * len(admitted)
    assert [matches(want, gpu | labels) for labels in refused] == [False] * len(refused)
    unfloored = plan_within_floor(s, inv, 1, None).primary
    job = build_job("d", "ns", s, unfloored, "k", image="b", images=IMAGES, owner={})
    assert required_terms(job["spec"]["template"]["spec"]) == [[product]]
    assert required_terms(pod_scheduling(s, unfloored, selector={}, group_selector=None)) == [[product]]


def matches(terms: list[list[dict[str, Any]]], labels: dict[str, str]) -> bool:
    """Kubernetes' nodeSelectorTerms semantics for In, Gt and DoesNotExist (terms ORed, expressions
    ANDed) on a node with these labels."""

    def holds(e: dict[str, Any]) -> bool:
        value = labels.get(e["key"])
        if e["operator"] == "DoesNotExist":
            return value is None
        if e["operator"] == "In":
            return value in e["values"]
        return value is not None and int(value) > int(e["values"][0])

    return any(all(holds(e) for e in term) for term in terms)
