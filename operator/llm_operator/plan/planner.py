"""Planner (pure): spec + GPU inventory -> per pool, the GPU product, tp, pp and pod layout.

Per pool (docs/placement.md has the full rules):
1. the precision must run on the product (fp8/w4a8 weights or fp8 KV: compute capability >= 8.9;
   bf16, int8-sq, int4-awq: >= 8.0);
2. TensorRT-LLM shards evenly: tp divides the attention heads and pp the layers, both powers of
   two, tp*pp <= 64;
3. the busiest rank's weights, activations, runtime and the KV cache for the spec's limits fit
   one GPU (plan/memory.py);
4. the ranks fit the nodes: tp*pp on one node; else TP inside a node and PP across nodes in one
   network block (or zone); TP across nodes only inside one NVLink clique (tensorParallelDomain nvlink);
5. choose by: fewest GPUs, then fewest nodes that PP spans (TP inside an NVLink domain before PP
   across nodes), then TP over NVLink before TP over PCIe, then lower pp, then the user's product
   order (best first) or, when unranked, the faster product, then the name.
Explicit tp/pp go through the same checks and the same order over products.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from llm_operator import labels as L
from llm_operator.api.v1alpha1 import (
    MAX_WORLD_SIZE,
    POWERS_OF_TWO,
    KvCacheDtype,
    LLMDeploymentSpec,
    ModelArchitecture,
    PoolPolicy,
    Precision,
)
from llm_operator.plan import catalogue, conversion, gpus, memory
from llm_operator.plan.driver import DriverFloor as Floor
from llm_operator.plan.inventory import UNBOUNDED, Inventory, LabelKeys, ProductSummary
from llm_operator.plan.layout import Layout, layout
from llm_operator.plan.types import Plan, PlanningError, PoolPlan

# Oldest GPU architecture each precision runs on (TensorRT-LLM / ModelOpt support matrix).
MIN_COMPUTE: dict[Precision, tuple[int, int]] = {
    Precision.FP16: (7, 0),
    Precision.BF16: (8, 0),
    Precision.FP8: (8, 9),
    Precision.INT8_SQ: (8, 0),
    Precision.INT4_AWQ: (8, 0),
    Precision.W4A8_AWQ: (8, 9),
}
MIN_KV_COMPUTE: dict[KvCacheDtype, tuple[int, int]] = {KvCacheDtype.FP8: (8, 9), KvCacheDtype.BF16: (8, 0)}
ARCHITECTURE_NAMES = {(7, 0): "Volta", (7, 5): "Turing", (8, 0): "Ampere", (8, 9): "Ada"}


@functools.cache
def _typical(keys: LabelKeys) -> dict[str, ProductSummary]:
    return {p.name: ProductSummary.typical(p, keys) for p in gpus.PRODUCTS.values()}


def _cc(cc: tuple[int, int]) -> str:
    return f"{cc[0]}.{cc[1]}"


def _precision_need(spec: LLMDeploymentSpec, s: ProductSummary) -> str | None:
    """What of the spec's precision this product's GPU architecture lacks, if anything."""
    for what, need in (
        (f"precision {spec.engine.precision.value}", MIN_COMPUTE[spec.engine.precision]),
        (f"kvCacheDtype {spec.engine.kv_cache_dtype.value}", MIN_KV_COMPUTE.get(spec.engine.kv_cache_dtype)),
    ):
        if need is not None and s.compute_capability < need:
            return f"{what} needs compute capability {_cc(need)} ({ARCHITECTURE_NAMES[need]}) or newer"
    return None


def _shapes(spec: LLMDeploymentSpec, arch: ModelArchitecture | None) -> list[tuple[int, int]]:
    par = spec.parallelism
    if arch is None:  # only with explicit tp and pp
        return [(int(par.tensor), int(par.pipeline))]
    tps = (
        [int(par.tensor)]
        if par.tensor != "auto"
        else [t for t in POWERS_OF_TWO if arch.num_attention_heads % t == 0]
    )
    pps = (
        [int(par.pipeline)]
        if par.pipeline != "auto"
        else [p for p in conversion.pipeline_choices(spec) or POWERS_OF_TWO if arch.num_layers % p == 0]
    )
    return [(t, p) for t in tps for p in pps if t * p <= MAX_WORLD_SIZE]


def _check_architecture(spec: LLMDeploymentSpec, arch: ModelArchitecture | None) -> None:
    par = spec.parallelism
    if arch is None:
        if par.is_auto:
            raise PlanningError(
                "UnknownArchitecture",
                f"parallelism 'auto' needs the model's shape, and {spec.model.name} is not in the "
                f"catalogue: set spec.model.architecture (numLayers, hiddenSize, numAttentionHeads, "
                f"numKeyValueHeads, vocabSize, parameterCount) or explicit parallelism",
            )
        return
    bad = []
    if par.tensor != "auto" and arch.num_attention_heads % int(par.tensor):
        bad.append(
            f"tensor parallelism {par.tensor} does not divide its {arch.num_attention_heads} attention heads"
        )
    if par.pipeline != "auto" and arch.num_layers % int(par.pipeline):
        bad.append(f"pipeline parallelism {par.pipeline} does not divide its {arch.num_layers} layers")
    if bad:
        raise PlanningError("InvalidParallelism", f"{spec.model.name}: {' and '.join(bad)}")


@dataclass(frozen=True)
class Candidate:
    key: tuple[Any, ...]
    summary: ProductSummary
    tp: int
    pp: int
    layout: Layout


@dataclass(frozen=True)
class PoolRequest:
    name: str
    products: tuple[str, ...]  # empty: any product
    weight: int = 1
    max_replicas: int | None = None


class _PoolPlanner:
    """Plans one pool; holds what every pool of one spec shares."""

    def __init__(self, spec: LLMDeploymentSpec, inventory: Inventory | None, floor: Floor | None) -> None:
        self.spec = spec
        self.inventory = inventory
        self.keys = inventory.keys if inventory is not None else LabelKeys()
        self.arch = catalogue.lookup(spec.model)
        _check_architecture(spec, self.arch)
        tolerations = [L.GPU_TOLERATION, *spec.placement.tolerations]
        self.node_filter = (spec.placement.node_selector, tolerations, floor)  # Inventory.summaries' filter
        self.shapes = _shapes(spec, self.arch)
        if not self.shapes:
            raise PlanningError("InvalidParallelism", f"tensor * pipeline must not exceed {MAX_WORLD_SIZE}")
        # Memory per shape does not depend on the product: computed once, compared per product.
        self.fits = {
            (tp, pp): memory.fits(self.arch, spec, tp, pp, 0) if self.arch is not None else None
            for tp, pp in self.shapes
        }
        self.needs = {shape: (f.min_need, f.need) for shape, f in self.fits.items() if f is not None}

    def fit(self, tp: int, pp: int, s: ProductSummary) -> memory.Fit | None:
        base = self.fits[(tp, pp)]
        return replace(base, capacity=s.memory_mib * memory.MIB) if base is not None else None

    def summaries(self) -> dict[str, ProductSummary]:
        if self.inventory is not None:
            return self.inventory.summaries(*self.node_filter)
        return _typical(self.keys)

    def _products(self, pool: PoolRequest) -> list[ProductSummary]:
        available = self.summaries()
        if pool.products:
            found = [available[p] for p in pool.products if p in available]
        else:
            found = sorted(
                (s for p, s in available.items() if not gpus.is_partitioned(p)),
                key=lambda s: (-(k.speed if (k := gpus.lookup(s.product)) else 0), s.product),
            )
        if not found:
            raise PlanningError("NoMatchingGPUProduct", self._none_offer(pool.products))
        min_memory = self.spec.resources.gpu.min_memory_mib
        if min_memory:
            roomy = [s for s in found if s.memory_mib >= min_memory]
            if not roomy:
                names = ", ".join(f"{s.product} ({s.memory_mib} MiB)" for s in found)
                raise PlanningError(
                    "NoMatchingGPUProduct",
                    f"resources.gpu.minMemoryMiB is {min_memory}; no product offered has that much: {names}",
                )
            found = roomy
        return found

    def _none_offer(self, products: Sequence[str]) -> str:
        if self.inventory is None:
            unknown = ", ".join(p for p in products if gpus.lookup(p) is None)
            return (
                f"{unknown}: not in the operator's GPU table (plan/gpus.py); plan against the "
                f"cluster's nodes (llm-operator render --nodes FILE)"
            )
        present = self.inventory.products()
        wanted = " or ".join(products) if products else "any GPU product"
        why = [f"{p}: {out}" for p in products if (out := self.inventory.left_out(p, *self.node_filter))]
        message = f"no schedulable node offers {wanted}"
        if why:
            message += f" ({'; '.join(why)})"
        return message + (
            f"; the cluster has {', '.join(present)}" if present else "; the cluster has no GPU nodes"
        )

    def plan(self, pool: PoolRequest) -> tuple[PoolPlan, str, int, list[str]]:
        """The pool's plan (replicas 0), its reason, its capacity in replicas, and warnings."""
        summaries = self._products(pool)
        capable = [s for s in summaries if _precision_need(self.spec, s) is None]
        if not capable:
            lacking = _precision_need(self.spec, summaries[0])
            have = ", ".join(f"{s.product} is {s.family} ({_cc(s.compute_capability)})" for s in summaries)
            raise PlanningError("PrecisionUnsupported", f"{lacking}; {have}")
        ranked = bool(pool.products)
        candidates: list[Candidate] = []
        # Shapes whose memory serves but whose layout fails; the message of the smallest, preferring
        # the one that spreads over most nodes (its shortage says most about the cluster), is kept.
        shortages: list[tuple[tuple[int, bool, int, int], str]] = []
        too_small: list[tuple[int, int, int, ProductSummary]] = []  # (shortfall, tp, pp, product)
        for rank, s in enumerate(capable):
            speed = k.speed if (k := gpus.lookup(s.product)) else 0
            for tp, pp in self.shapes:
                min_need, need = self.needs.get((tp, pp), (0, 0))
                capacity = s.memory_mib * memory.MIB
                if min_need > capacity:
                    too_small.append((need - capacity, tp, pp, s))
                    continue
                lay = layout(tp, pp, s, self.spec, self.keys)
                partial = need > capacity
                if isinstance(lay, str):
                    shortages.append(((tp * pp, partial, rank, -pp), self._at_least(tp, pp, s, lay)))
                    continue
                order = rank if ranked else -speed
                key = (partial, tp * pp, lay.pp_nodes, tp > 1 and not s.nvlink, pp, order, s.product)
                candidates.append(Candidate(key, s, tp, pp, lay))
        if not candidates:
            if shortages:
                raise PlanningError("InsufficientGPUs", min(shortages)[1])
            _, tp, pp, s = min(too_small, key=lambda t: t[0])
            raise PlanningError("ModelDoesNotFit", self._does_not_fit(tp, pp, s, capable))
        best = min(candidates, key=lambda c: c.key)
        return self._pool_plan(pool, best, candidates)

    def _at_least(self, tp: int, pp: int, s: ProductSummary, shortage: str) -> str:
        if not self.spec.parallelism.is_auto:
            return shortage
        return (
            f"{self.spec.model.name} needs at least {tp * pp} {s.product} GPUs (tp={tp} pp={pp}): {shortage}"
        )

    def _does_not_fit(self, tp: int, pp: int, s: ProductSummary, products: Sequence[ProductSummary]) -> str:
        e, fit, shape = self.spec.engine, self.fit(tp, pp, s), f"tp={tp} pp={pp} on {s.product}"
        assert fit is not None
        tried = f"no tp x pp up to {MAX_WORLD_SIZE} GPUs fits; " if self.spec.parallelism.is_auto else ""
        return (
            f"{self.spec.model.name} ({e.precision.value}, maxBatchSize {e.max_batch_size}, maxSeqLen "
            f"{e.max_seq_len}) on {', '.join(s.product for s in products)}: {tried}closest is {shape}: "
            f"{fit.describe()}; lower the limits, bound runtime.kvCache.maxTokens or quantize"
        )

    def _pool_plan(
        self, pool: PoolRequest, best: Candidate, candidates: Sequence[Candidate]
    ) -> tuple[PoolPlan, str, int, list[str]]:
        s, lay, fit = best.summary, best.layout, self.fit(best.tp, best.pp, best.summary)
        same = (lay.gpus_per_pod, lay.pods, lay.clique, lay.group_key)
        # Engines are per GPU architecture: pods may use any product of the same compute
        # capability on which this very shape fits as well (a full batch if it does here) and
        # lays out the same way.
        allowed = [
            c.summary
            for c in candidates
            if (c.tp, c.pp) == (best.tp, best.pp)
            and c.key[0] <= best.key[0]
            and c.summary.compute_capability == s.compute_capability
            and (c.layout.gpus_per_pod, c.layout.pods, c.layout.clique, c.layout.group_key) == same
        ]
        plan = PoolPlan(
            name=pool.name,
            gpu_product=s.product,
            allowed_products=tuple(a.product for a in allowed),
            compute_capability=s.compute_capability,
            gpu_memory_mib=s.memory_mib,
            tensor=best.tp,
            pipeline=best.pp,
            gpus_per_pod=lay.gpus_per_pod,
            pods_per_replica=lay.pods,
            replicas=0,
            nvlink_clique=lay.clique,
            group_topology_key=lay.group_key if lay.pods > 1 else None,
        )
        world = best.tp * best.pp
        if lay.pods == 1:
            where = "on one node"
        elif lay.clique:
            where = f"as {lay.pods} pods of {lay.gpus_per_pod} in one NVLink clique"
        else:
            where = f"as {lay.pods} pods of {lay.gpus_per_pod} (TP inside a node, PP across nodes)"
        memory_part = fit.describe() if fit is not None else "memory not checked (architecture unknown)"
        per_replica = f"{world} GPU{'s' if world > 1 else ''} per replica {where}"
        reason = f"tp={best.tp} pp={best.pp} on {s.product}: {memory_part}; {per_replica}"
        warnings = [lay.warning] if lay.warning else []
        if fit is not None and not fit:
            e = self.spec.engine
            warnings.append(
                f"pool {pool.name}: the KV cache holds {fit.pool_tokens:,} tokens, less than "
                f"{e.max_batch_size} sequences of {e.max_seq_len} need ({fit.kv_tokens:,}): fewer run "
                f"at once; more GPUs, lower limits or runtime.kvCache.maxTokens would match them"
            )
        if self.arch is None:
            warnings.append(
                f"{self.spec.model.name} is not in the catalogue and spec.model.architecture is unset: "
                f"GPU memory was not checked"
            )
        capacity = sum(a.pod_slots(lay.gpus_per_pod) for a in allowed) // lay.pods
        return plan, reason, min(capacity, UNBOUNDED), warnings


def split_replicas(
    replicas: int,
    policy: PoolPolicy,
    weights: Sequence[int],
    limits: Sequence[int | None],
    capacities: Sequence[int],
) -> list[int]:
    """Replicas per pool. `ordered`: fill pools in order up to min(maxReplicas, capacity); what is
    left goes to the first pools still under maxReplicas (their pods wait for capacity). `weighted`:
    largest-remainder shares of the integer weights, capped by maxReplicas, the excess re-shared.
    The sum is less than `replicas` only when every pool is at its maxReplicas."""
    n = len(weights)
    room = [replicas if m is None else m for m in limits]
    counts = [0] * n
    left = replicas
    if policy == PoolPolicy.ORDERED:
        for bound in (capacities, room):
            for i in range(n):
                take = max(0, min(left, bound[i] - counts[i], room[i] - counts[i]))
                counts[i] += take
                left -= take
        return counts
    open_ = [i for i in range(n) if room[i] > 0]
    while left and open_:
        total = sum(weights[i] for i in open_)
        share = {i: left * weights[i] // total for i in open_}
        by_remainder = sorted(open_, key=lambda i: (-(left * weights[i] % total), i))
        for i in by_remainder[: left - sum(share.values())]:
            share[i] += 1
        for i in open_:
            take = min(share[i], room[i] - counts[i])
            counts[i] += take
            left -= take
        open_ = [i for i in open_ if counts[i] < room[i]]
    return counts


def _requests(spec: LLMDeploymentSpec) -> list[PoolRequest]:
    gpu = spec.resources.gpu
    if gpu.pools:
        return [PoolRequest(p.name, tuple(p.products), p.weight, p.max_replicas) for p in gpu.pools]
    return [PoolRequest("main", tuple(gpu.products or ()))]


def plan_deployment(
    spec: LLMDeploymentSpec, inventory: Inventory | None, replicas: int, driver_floor: Floor | None = None
) -> Plan:
    """Plan every GPU pool of the spec on nodes whose CUDA driver `driver_floor` admits and
    divide `replicas` between them. Raises PlanningError (CamelCase reason, a sentence saying what
    is missing) when any pool cannot be placed: a partial plan would delete the pools that fail."""
    planner = _PoolPlanner(spec, inventory, driver_floor)
    conversion.check(spec)
    requests = _requests(spec)
    planned: list[tuple[PoolPlan, str, int]] = []
    warnings: list[str] = []
    for request in requests:
        try:
            pool, reason, capacity, pool_warnings = planner.plan(request)
            conversion.check_pool(spec, pool)
        except PlanningError as e:
            if len(requests) == 1:
                raise
            raise PlanningError(e.reason, f"pool {request.name}: {e.message}") from None
        planned.append((pool, reason, capacity))
        warnings += pool_warnings
    counts = split_replicas(
        replicas,
        spec.resources.gpu.pool_policy,
        [r.weight for r in requests],
        [r.max_replicas for r in requests],
        [capacity for _, _, capacity in planned],
    )
    if sum(counts) < replicas:
        warnings.append(f"{replicas} replicas requested; the pools' maxReplicas allow {sum(counts)}")
    pools = tuple(replace(pool, replicas=n) for (pool, _, _), n in zip(planned, counts, strict=True))
    for pool, (_, _, capacity) in zip(pools, planned, strict=True):
        if inventory is not None and pool.replicas > capacity:
            warnings.append(
                f"pool {pool.name}: {pool.replicas} replicas planned, the nodes of "
                f"{', '.join(pool.allowed_products)} hold {capacity}: the rest stay Pending"
            )
    if len(pools) == 1:
        reason = planned[0][1]
    else:
        reason = "; ".join(
            f"pool {pool.name} ({pool.replicas} {'replica' if pool.replicas == 1 else 'replicas'}): {why}"
            for pool, (_, why, _) in zip(pools, planned, strict=True)
        )
    return Plan(pools=pools, reason=reason, warnings=tuple(warnings))
