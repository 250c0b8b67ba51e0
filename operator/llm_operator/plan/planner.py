"""Planner (pure): spec + GPU inventory -> GPU product, tp, pp and pod layout per pool.

Rules, in order of preference (docs/placement.md):
1. the precision must run on the product (fp8/w4a8 and fp8 KV need compute capability >= 8.9);
2. weights + KV cache for the spec's limits + runtime must fit each GPU (plan/memory.py);
3. TensorRT-LLM shards evenly: tp divides attention heads, pp divides layers, tp*pp <= 64;
4. fewest GPUs per replica, then fewest nodes (TP inside a node or NVLink clique before PP
   across nodes), then the user's product order (best first), then the faster product.
Explicit tp/pp are validated against the same rules instead of chosen.
"""

from __future__ import annotations

from dataclasses import dataclass

from llm_operator.api.v1alpha1 import (
    MAX_WORLD_SIZE,
    POWERS_OF_TWO,
    KvCacheDtype,
    LLMDeploymentSpec,
    ModelArchitecture,
    PoolPolicy,
    Precision,
)
from llm_operator.plan import catalogue, memory
from llm_operator.plan.gpus import PRODUCTS
from llm_operator.plan.inventory import Inventory
from llm_operator.plan.types import Plan, PlanningError, PoolPlan

FP8_PRECISIONS = (Precision.FP8, Precision.W4A8_AWQ)
ASSUMED_NODES = 1 << 20  # without an inventory, capacity is not the limit


@dataclass(frozen=True)
class ProductView:
    """What one product offers: from the inventory when there is one, else the product table."""

    name: str
    gpus_per_node: int
    largest_node: str
    nodes: int
    clique_gpus: int  # GPUs in the largest NVLink clique (multi-node NVLink), 0 if none
    total_gpus: int
    compute_capability: tuple[int, int]
    memory_mib: int

    @classmethod
    def of(cls, product: str, inventory: Inventory | None) -> ProductView | None:
        known = PRODUCTS.get(product)
        if inventory is None:
            if known is None:
                return None
            clique = 72 if known.family == "blackwell" and known.gpus_per_node == 4 else 0
            return cls(product, known.gpus_per_node, "(typical node)", ASSUMED_NODES, clique,
                       ASSUMED_NODES, known.compute_capability, known.memory_mib)  # fmt: skip
        nodes = inventory.of_product(product)
        if not nodes:
            return None
        largest = max(nodes, key=lambda n: (n.gpus, n.name))
        cliques: dict[str, int] = {}
        for n in nodes:
            if n.clique:
                cliques[n.clique] = cliques.get(n.clique, 0) + n.gpus
        return cls(
            product, largest.gpus, largest.name, len(nodes), max(cliques.values(), default=0),
            sum(n.gpus for n in nodes), largest.compute_capability, min(n.memory_mib for n in nodes),
        )  # fmt: skip


@dataclass(frozen=True)
class Layout:
    gpus_per_pod: int
    pods: int
    clique: bool


def layout(tp: int, pp: int, view: ProductView) -> Layout | str:
    """How one replica of tp x pp GPUs is laid out on this product's nodes, or why it cannot be."""
    world, per_node = tp * pp, view.gpus_per_node
    if world <= per_node:
        return Layout(world, 1, False)
    if tp <= per_node:
        # PP across nodes: each pod holds whole TP groups (as many stages as fit a node).
        stages = max(d for d in range(1, pp + 1) if pp % d == 0 and tp * d <= per_node)
        pods = pp // stages
        if pods > view.nodes:
            return (
                f"a replica needs {pods} nodes with {tp * stages} {view.name} GPUs; only {view.nodes} exist"
            )
        return Layout(tp * stages, pods, False)
    if view.clique_gpus >= world and world % per_node == 0:
        return Layout(per_node, world // per_node, True)  # TP over multi-node NVLink
    return (
        f"no node offers {tp} allocatable {view.name} GPUs for tensor parallelism {tp}; "
        f"largest is {per_node} on {view.largest_node}"
        + ("" if not view.clique_gpus else f", largest NVLink clique has {view.clique_gpus}")
    )


def _needs_fp8(spec: LLMDeploymentSpec) -> bool:
    return spec.engine.precision in FP8_PRECISIONS or spec.engine.kv_cache_dtype == KvCacheDtype.FP8


def _divisors(n: int) -> list[int]:
    return [d for d in POWERS_OF_TWO if n % d == 0]


def _pool_plan(
    name: str,
    spec: LLMDeploymentSpec,
    arch: ModelArchitecture | None,
    products: list[str],
    inventory: Inventory | None,
    *,
    ranked: bool = True,
) -> tuple[PoolPlan, str]:
    """`ranked`: the user listed the products best first; otherwise faster products win ties."""
    views = [v for p in products if (v := ProductView.of(p, inventory)) is not None]
    if not views:
        have = ", ".join(inventory.products()) if inventory is not None else "unknown products"
        raise PlanningError(
            "NoMatchingGPUProduct",
            f"no schedulable node offers any of {', '.join(products)} (the cluster has: {have or 'no GPUs'})",
        )
    if _needs_fp8(spec):
        capable = [v for v in views if v.compute_capability >= (8, 9)]
        if not capable:
            v = views[0]
            raise PlanningError(
                "PrecisionUnsupported",
                f"fp8 needs compute capability 8.9 or newer (Ada/Hopper); {v.name} has "
                f"{v.compute_capability[0]}.{v.compute_capability[1]}",
            )
        views = capable
    auto = spec.parallelism.is_auto
    if not auto and arch is not None:
        tp, pp = int(spec.parallelism.tensor), int(spec.parallelism.pipeline)
        if arch.num_attention_heads % tp or arch.num_layers % pp:
            raise PlanningError(
                "InvalidParallelism",
                f"{spec.model.name} has {arch.num_attention_heads} attention heads and {arch.num_layers} "
                f"layers: tensor parallelism must divide the heads and pipeline parallelism the layers "
                f"(got tp={tp}, pp={pp})",
            )
    if auto and arch is None:
        raise PlanningError(
            "UnknownArchitecture",
            f"parallelism 'auto' needs the model's shape: set spec.model.architecture for {spec.model.name}",
        )
    best: tuple[tuple[int, ...], PoolPlan, str] | None = None
    first_error = ""
    for rank, view in enumerate(views):
        for tp, pp in _shapes(spec, arch):
            shape = layout(tp, pp, view)
            if isinstance(shape, str):
                first_error = first_error or shape
                continue
            fit = memory.per_gpu(arch, spec, tp, pp, view.memory_mib) if arch is not None else None
            if fit is not None and not fit.fits:
                first_error = first_error or (
                    f"{spec.model.name} ({spec.engine.precision.value}) with tp={tp} pp={pp} on {view.name}: "
                    f"{fit.describe()}"
                )
                continue
            speed = PRODUCTS[view.name].speed if view.name in PRODUCTS else 0
            key = (tp * pp, shape.pods, rank if ranked else 0, -speed, pp)
            if best is None or key < best[0]:
                same_arch = tuple(v.name for v in views if v.compute_capability == view.compute_capability)
                plan = PoolPlan(
                    name=name, gpu_product=view.name, allowed_products=same_arch,
                    compute_capability=view.compute_capability, gpu_memory_mib=view.memory_mib,
                    tensor=tp, pipeline=pp, gpus_per_pod=shape.gpus_per_pod, pods_per_replica=shape.pods,
                    replicas=0, nvlink_clique=shape.clique,
                )  # fmt: skip
                where = (
                    "one node" if shape.pods == 1
                    else f"{shape.pods} nodes of one NVLink clique" if shape.clique
                    else f"{shape.pods} nodes, TP inside each, PP across"
                )  # fmt: skip
                why = f"tp={tp} pp={pp} on {view.name}, {tp * pp} GPUs per replica on {where}"
                if fit is not None:
                    why += f": {fit.describe()}"
                else:
                    why += " (model architecture unknown: memory not checked)"
                best = (key, plan, why)
        if best is not None and not auto:
            break  # explicit tp/pp: the first product in the user's order that works
    if best is None:
        reason = "ModelDoesNotFit" if "GiB" in first_error else "InsufficientGPUs"
        if auto and reason == "ModelDoesNotFit":
            first_error = (
                f"no tp x pp up to {MAX_WORLD_SIZE} GPUs fits {spec.model.name} "
                f"({spec.engine.precision.value}) on {', '.join(v.name for v in views)}; "
                f"smallest tried: {first_error}"
            )
        raise PlanningError(reason, first_error)
    return best[1], best[2]


def _shapes(spec: LLMDeploymentSpec, arch: ModelArchitecture | None) -> list[tuple[int, int]]:
    par = spec.parallelism
    if not par.is_auto:
        return [(int(par.tensor), int(par.pipeline))]
    assert arch is not None
    tps = [int(par.tensor)] if par.tensor != "auto" else _divisors(arch.num_attention_heads)
    pps = [int(par.pipeline)] if par.pipeline != "auto" else _divisors(arch.num_layers)
    return sorted(
        ((t, p) for t in tps for p in pps if t * p <= MAX_WORLD_SIZE), key=lambda s: (s[0] * s[1], s[1])
    )


def _capacity(pool: PoolPlan, inventory: Inventory | None) -> int:
    """How many replicas of this pool the cluster can hold at most (GPU count bound)."""
    if inventory is None:
        return ASSUMED_NODES
    gpus = sum(n.gpus for p in pool.allowed_products for n in inventory.of_product(p))
    return gpus // pool.world_size


def _split(replicas: int, pools: list[tuple[PoolPlan, int, int | None]], policy: PoolPolicy,
           inventory: Inventory | None) -> list[int]:  # fmt: skip
    """Replicas per pool: `ordered` fills pools in order (later ones overflow), `weighted` divides
    by integer weights (largest remainder). Both respect each pool's maxReplicas."""
    caps = [min(_capacity(p, inventory), m if m is not None else replicas) for p, _, m in pools]
    counts = [0] * len(pools)
    if policy == PoolPolicy.WEIGHTED:
        total = sum(w for _, w, _ in pools)
        shares = [replicas * w / total for _, w, _ in pools]
        counts = [min(int(s), c) for s, c in zip(shares, caps, strict=True)]
        order = sorted(range(len(pools)), key=lambda i: shares[i] - int(shares[i]), reverse=True)
    else:
        order = list(range(len(pools)))
    left = replicas - sum(counts)
    for i in order * 2:  # second pass places what the remainders left
        take = min(left, caps[i] - counts[i])
        counts[i] += take
        left -= take
    counts[0] += left  # beyond every cap: the preferred pool takes it and reports pending pods
    return counts


def plan_deployment(spec: LLMDeploymentSpec, inventory: Inventory | None, replicas: int) -> Plan:
    arch = catalogue.lookup(spec.model)
    gpu = spec.resources.gpu
    if gpu.pools:
        requested = [(p.name, list(p.products), p.weight, p.max_replicas) for p in gpu.pools]
        ranked = True
    else:
        default = list(gpu.products or (inventory.products() if inventory is not None else list(PRODUCTS)))
        if gpu.min_memory_mib:
            default = [
                p for p in default
                if (v := ProductView.of(p, inventory)) is not None and v.memory_mib >= gpu.min_memory_mib
            ]  # fmt: skip
        requested = [("main", default, 1, None)]
        ranked = bool(gpu.products)
    planned: list[tuple[PoolPlan, int, int | None]] = []
    reasons: list[str] = []
    for name, products, weight, max_replicas in requested:
        pool, why = _pool_plan(name, spec, arch, products, inventory, ranked=ranked)
        planned.append((pool, weight, max_replicas))
        reasons.append(why if len(requested) == 1 else f"pool {name}: {why}")
    counts = _split(replicas, planned, gpu.pool_policy, inventory)
    pools = tuple(
        PoolPlan(**{**pool.__dict__, "replicas": n}) for (pool, _, _), n in zip(planned, counts, strict=True)
    )
    warnings = () if arch is not None else (f"architecture of {spec.model.name} unknown: memory not checked",)
    return Plan(pools=pools, reason="; ".join(reasons), warnings=warnings)


__all__ = ["Layout", "ProductView", "layout", "plan_deployment"]
