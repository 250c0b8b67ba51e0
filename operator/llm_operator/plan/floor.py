"""The CUDA driver floor: a node whose driver cannot run the serving release's CUDA is no placement
candidate. That is a driver older than the release's `min_driver`, unless the GPU is a data-center
GPU on one of the long-term branches the release lists (`datacenter_drivers`, CUDA forward
compatibility) at or above that branch's minimum (plan/driver.py DriverFloor).

GPU Feature Discovery labels each node with its driver (plan/driver.py). A node without those
labels has an unknown driver and stays a candidate: there is nothing to check it against. The
planner leaves nodes the floor refuses out (Inventory.summaries). Node affinity holds only the
coarse floor, the lowest driver major any branch allows (DriverFloor.coarse): the exact rule per
GPU class and branch would take a term per branch, class and label generation. The pools carry
that coarse floor only where a node of their products is below it (`_coarse`): a term that keeps
no node off would change every GPU pod template, and roll every deployment, for nothing. This
module tells the user the rest: a plan warning names the nodes left out, and when the floor alone
stands between the spec and a plan, the error is DriverBelowReleaseFloor, naming the nodes, their
drivers and the way out.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace

from llm_operator import labels as L
from llm_operator import releases
from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.plan import gpus
from llm_operator.plan.driver import DriverFloor
from llm_operator.plan.inventory import GpuNode, Inventory
from llm_operator.plan.planner import plan_deployment
from llm_operator.plan.types import Plan, PlanningError, PoolPlan

SHOWN = 5  # nodes a message names; the rest are counted
REASON = "DriverBelowReleaseFloor"


def plan_within_floor(
    spec: LLMDeploymentSpec, inventory: Inventory | None, replicas: int, release: releases.Release | None
) -> Plan:
    """plan_deployment on the nodes whose CUDA driver the release runs on (None: no floor)."""
    if release is None:
        return plan_deployment(spec, inventory, replicas)
    floor = DriverFloor.of(release)
    try:
        plan = plan_deployment(spec, inventory, replicas, floor)
    except PlanningError:
        if inventory is None:
            raise
        left_out = below(inventory, spec, floor, _considered(spec))
        if not left_out:
            raise
        try:
            without_floor = plan_deployment(spec, inventory, replicas)
        except PlanningError as other:
            # More than the driver is missing: say what, and that the driver is too.
            raise PlanningError(
                other.reason, f"{other.message}; besides, {_note(release, left_out)}"
            ) from None
        hosts = {p for pool in without_floor.pools for p in pool.allowed_products}
        raise PlanningError(REASON, _refusal(spec, release, below(inventory, spec, floor, hosts))) from None
    if inventory is not None:
        plan = replace(plan, pools=tuple(_coarse(pool, inventory, floor) for pool in plan.pools))
    left_out = below(inventory, spec, floor, _considered(spec)) if inventory is not None else []
    if not left_out:
        return plan
    return replace(plan, warnings=(*plan.warnings, _note(release, left_out)))


def below(
    inventory: Inventory, spec: LLMDeploymentSpec, floor: DriverFloor, products: Collection[str] | None
) -> list[GpuNode]:
    """Nodes of `products` (None: any whole-GPU product) that the pods could use but for their
    driver, by name."""
    tolerations = [L.GPU_TOLERATION, *spec.placement.tolerations]
    return sorted(
        (
            n
            for n in inventory.nodes.values()
            if not n.meets(floor)
            and n.admits(spec.placement.node_selector, tolerations)
            and (n.product in products if products is not None else not gpus.is_partitioned(n.product))
        ),
        key=lambda n: n.name,
    )


def _considered(spec: LLMDeploymentSpec) -> set[str] | None:
    """The products the spec's pools may use; None: a pool that lists none takes any."""
    gpu = spec.resources.gpu
    lists = [p.products for p in gpu.pools] if gpu.pools else [gpu.products or []]
    return None if any(not products for products in lists) else {p for ps in lists for p in ps}


def _refusal(spec: LLMDeploymentSpec, release: releases.Release, nodes: Sequence[GpuNode]) -> str:
    runnable = [r for r in releases.RELEASES if any(_runs(r, n) for n in nodes)]
    if runnable:
        older = (
            f", or serve a release their driver runs: {', '.join(_name(r) for r in runnable)} (the "
            f"chart's operator.runtimeImage and operator.trtllmVersion, or this deployment's "
            f"engine.build.tensorrtLlmVersion with runtime.image and engine.build.image)"
        )
    else:
        older = " (no release the operator knows runs on their drivers)"
    return (
        f"no node can host {spec.model.name} within the CUDA driver floor: {_name(release)} needs "
        f"driver {DriverFloor.of(release)}, and the nodes that could host it have older ones: "
        f"{_nodes(nodes)}; upgrade their NVIDIA driver to {release.min_driver} or newer{older}"
    )


def _note(release: releases.Release, nodes: Sequence[GpuNode]) -> str:
    return (
        f"{_nodes(nodes)} left out: their CUDA driver is older than the {DriverFloor.of(release)} "
        f"that {_name(release)} needs; upgrade their NVIDIA driver to use them"
    )


def _coarse(pool: PoolPlan, inventory: Inventory, floor: DriverFloor) -> PoolPlan:
    """The pool with the coarse floor for its pods' node affinity where a node of its products
    has a driver below it (whatever else keeps pods off that node: a taint or a cordon may go)."""
    below = any(
        n.driver is not None and n.driver[0] < floor.coarse and n.product in pool.allowed_products
        for n in inventory.nodes.values()
    )
    return replace(pool, driver_floor=floor.coarse) if below else pool


def _runs(release: releases.Release, node: GpuNode) -> bool:
    return DriverFloor.of(release).admits(node.product, node.driver)


def _name(release: releases.Release) -> str:
    return f"tritonserver {release.ngc_tag} (TensorRT-LLM {release.trtllm})"


def _nodes(nodes: Sequence[GpuNode]) -> str:
    shown = ", ".join(f"{n.name} (driver {n.driver_version})" for n in nodes[:SHOWN])
    return shown + (f" and {len(nodes) - SHOWN} more" if len(nodes) > SHOWN else "")
