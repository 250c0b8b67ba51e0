"""How one replica's tp x pp ranks sit on the nodes of one GPU product (pure).

tp*pp on one node when a node has that many GPUs; else TP inside a node and PP across nodes of one
network block (or zone); TP across nodes only inside one NVLink clique, and never with
placement.tensorParallelDomain `node`. The fewest pods win.
"""

from __future__ import annotations

from dataclasses import dataclass

from llm_operator import labels as L
from llm_operator.api.v1alpha1 import (
    POWERS_OF_TWO,
    LLMDeploymentSpec,
    PipelineParallelDomain,
    Strictness,
    TensorParallelDomain,
)
from llm_operator.plan.inventory import LabelKeys, ProductSummary, Scope


@dataclass(frozen=True)
class Layout:
    """How one replica's tp*pp ranks sit on nodes."""

    gpus_per_pod: int
    pods: int
    clique: bool = False  # TP spans the nodes of one NVLink clique
    group_key: str | None = None  # node label all pods of a multi-pod replica share
    warning: str | None = None

    @property
    def pp_nodes(self) -> int:
        """Nodes that pipeline stages span over the network (1 when NVLink joins all ranks)."""
        return 1 if self.clique else self.pods


def _pp_domain(
    s: ProductSummary, spec: LLMDeploymentSpec, keys: LabelKeys
) -> tuple[Scope | None, str | None, str | None]:
    """(scope the stages must share, its node label, warning) for PP across nodes."""
    domain = spec.placement.pipeline_parallel_domain
    if domain == PipelineParallelDomain.ANY:
        return None, None, None
    if domain == PipelineParallelDomain.NETWORK_BLOCK and s.block_key:
        return "block", s.block_key, None
    if s.zone_key:
        if domain == PipelineParallelDomain.ZONE:
            return "zone", s.zone_key, None
        blocks = " or ".join(keys.network_block)
        return "zone", s.zone_key, f"{s.product} nodes carry no {blocks} label: PP stages stay in one zone"
    return None, None, f"{s.product} nodes carry no {keys.zone} label: PP stages may span zones"


def layout(tp: int, pp: int, s: ProductSummary, spec: LLMDeploymentSpec, keys: LabelKeys) -> Layout | str:
    """The layout of tp x pp ranks on this product's nodes with the fewest pods, or why none exists."""
    world = tp * pp
    if s.nodes_with(world) > 0:
        return Layout(world, 1)
    if tp <= s.largest:
        # TP inside a node, PP across nodes: each pod holds whole TP groups, as many stages as fit.
        scope, key, warning = _pp_domain(s, spec, keys)
        within = scope if spec.placement.pipeline_parallel_strictness == Strictness.REQUIRED else None
        stage_counts = [st for st in reversed(POWERS_OF_TWO) if st < pp and tp * st <= s.largest]
        for stages in stage_counts:
            if s.nodes_with(tp * stages, within) >= pp // stages:
                return Layout(tp * stages, pp // stages, group_key=key, warning=warning)
        g, pods = tp * stage_counts[0], pp // stage_counts[0]
        if within is None:
            have = f"{s.nodes_with(g)} exist"
        else:
            label = "network block" if within == "block" else "zone"
            have = (
                f"in one {label} ({key}) the most is {s.nodes_with(g, within)}, in {s.best_domain(g, within)}"
            )
        return (
            f"a replica of tp={tp} pp={pp} needs {pods} nodes with {g} allocatable {s.product} GPUs; {have}"
        )
    largest = f"no node offers {tp} allocatable {s.product} GPUs; largest is {s.largest} on {s.largest_node}"
    if not s.nvlink:
        return f"{largest} ({s.product} is PCIe-only: tensor parallelism stays inside one node)"
    # TP across nodes: only over multi-node NVLink, inside one clique, and only if the user allows it.
    sizes = [g for g in reversed(POWERS_OF_TWO) if g <= s.largest]
    shared = any(s.nodes_with(g, "clique") for g in sizes)
    if spec.placement.tensor_parallel_domain == TensorParallelDomain.NODE:
        return (
            f"{largest}, and placement.tensorParallelDomain node keeps tensor parallelism inside one "
            f"node: lower parallelism.tensor to at most {s.largest} and raise parallelism.pipeline"
            + (", or set tensorParallelDomain nvlink to span nodes of one NVLink clique" if shared else "")
        )
    if not shared:
        return f"{largest}, and no nodes share an NVLink clique ({L.GPU_CLIQUE})"
    for g in sizes:
        if s.nodes_with(g, "clique") >= world // g:
            return Layout(g, world // g, clique=True, group_key=L.GPU_CLIQUE)
    return (
        f"tensor parallelism {tp} over {s.product} needs {world // sizes[0]} nodes with {sizes[0]} GPUs in "
        f"one NVLink clique; the largest clique has {s.nodes_with(sizes[0], 'clique')}"
    )
