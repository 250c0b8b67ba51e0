"""What the planner decides and the builders consume: a placement plan per GPU pool.

The planner (plan/planner.py) turns spec + node inventory into a Plan; the builders (render/) turn
spec + Plan into Kubernetes objects. Both sides are pure, so this module is the whole contract.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PoolPlan:
    """One GPU pool's share of the deployment: its own StatefulSet(s) and its own engine."""

    name: str  # DNS label; "main" when the spec has a single pool
    gpu_product: str  # the nvidia.com/gpu.product the engine is built for
    allowed_products: tuple[str, ...]  # products pods may land on (same GPU architecture)
    compute_capability: tuple[int, int]  # (major, minor): the engine's GPU architecture
    gpu_memory_mib: int
    tensor: int
    pipeline: int
    gpus_per_pod: int  # GPUs requested by each serving pod
    pods_per_replica: int  # > 1: a multi-node group, rank 0 (pod 0) is the leader
    replicas: int
    nvlink_clique: bool = False  # TP spans nodes of one nvidia.com/gpu.clique
    # Node label every pod of a multi-pod replica must share (nvidia.com/gpu.clique, the network
    # block or zone label the nodes carry); None: no co-location rule.
    group_topology_key: str | None = None
    # The lowest CUDA driver major the serving release runs on (plan/driver.py DriverFloor.coarse):
    # the pods' node affinity keeps them off nodes GFD reports an older driver on. None: no such
    # term, as no node of the pool's products is below it (plan/floor.py), or no floor (CPU, or a
    # release the table lacks).
    driver_floor: int | None = None

    @property
    def world_size(self) -> int:
        return self.tensor * self.pipeline

    @property
    def sm(self) -> str:
        return f"sm{self.compute_capability[0]}{self.compute_capability[1]}"


@dataclass(frozen=True)
class Plan:
    pools: tuple[PoolPlan, ...]
    reason: str  # one sentence a user reads in status.placement.reason and the Event
    warnings: tuple[str, ...] = field(default=())

    @property
    def primary(self) -> PoolPlan:
        return self.pools[0]

    @property
    def replicas(self) -> int:
        return sum(p.replicas for p in self.pools)


class PlanningError(Exception):
    """The spec cannot be placed; `reason` is CamelCase, the message says what is missing."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
