"""How many replicas each revision gets for a canary weight, and the weight actually in effect.

replica-ratio: one client Service over both revisions, so the canary's share of ready replicas is
its weight. Canary replicas follow Argo Rollouts' rounding (nearest, ties up; at least 1 for
weights 1-99 and, unlike Argo, the stable keeps at least 1 too, so a single replica surges to two
rather than send all traffic to an unproven revision). The stable shrinks only by READY canary
replicas (KServe #5983: shrinking by the target lost capacity while the canary was still loading).

gateway-api: an HTTPRoute splits the traffic, so the stable keeps the full count and the canary
gets ceil(total x weight): each revision can take its share of the whole load. A backend gets
route weight only once enough of its replicas are ready for that weight.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from llm_operator.api.v1alpha1 import CanarySpec, RevisionsStatus, RolloutPhase, TrafficRouting
from llm_operator.rollout.types import Slot, SlotObserved


@dataclass(frozen=True)
class Split:
    stable: int  # replicas of the stable slot
    canary: int  # replicas of the canary slot
    weight: int  # percent of traffic the canary actually gets
    reached: bool  # the wanted weight is in effect (a step's pause timer may start)
    route: dict[str, int]  # HTTPRoute weights; replica-ratio keeps them at the stable


def _route(canary: int) -> dict[str, int]:
    return {"stable": 100 - canary, "canary": canary}


def ratio_canary_replicas(total: int, weight: int) -> int:
    """Argo Rollouts' basic-canary rounding, with one surge replica when total is 1."""
    if total <= 0 or weight <= 0:
        return 0
    if weight >= 100:
        return total
    nearest = (total * weight + 50) // 100
    return 1 if total == 1 else min(max(nearest, 1), total - 1)


def gateway_canary_replicas(total: int, weight: int) -> int:
    if total <= 0 or weight <= 0:
        return 0
    return min(total, -(-total * weight // 100))


def ready_share(canary_ready: int, stable_ready: int) -> int:
    """Percent of the ready replicas (of one client Service) that run the canary."""
    serving = canary_ready + stable_ready
    return 0 if serving == 0 else (200 * canary_ready + serving) // (2 * serving)


def replica_ratio(total: int, weight: int, canary_ready: int, stable_ready: int) -> Split:
    canary = ratio_canary_replicas(total, weight)
    floor = 1 if 0 < weight < 100 and total >= 1 else 0
    counted = min(canary_ready, canary)
    stable = max(total - counted, floor)
    effective = ready_share(counted, min(stable_ready, stable))
    return Split(stable, canary, effective, counted >= canary, _route(0))


def gateway_api(total: int, weight: int, steps: list[int], canary_ready: int, route_ready: bool) -> Split:
    """`steps`: the weights the rollout went through so far; the route falls back to the largest
    one the ready canary replicas can carry until the wanted weight's replicas are ready."""
    canary = gateway_canary_replicas(total, weight)
    carried = max(
        (w for w in [0, *steps, weight] if w <= weight and gateway_canary_replicas(total, w) <= canary_ready),
        default=0,
    )
    if total <= 0:
        carried = 0
    effective = carried if route_ready else 0
    return Split(total, canary, effective, route_ready and carried == weight, _route(carried))


def withdrawn(
    total: int, gateway: bool, canary_replicas: int, canary_ready: int, stable_ready: int, scale_down: bool
) -> Split:
    """An aborted canary: no traffic, stable back to the full count.

    gateway-api takes the route weight away at once and keeps the canary's pods until the scale
    down delay is over. replica-ratio can only take traffic away by removing canary pods, so it
    does that at once, as Argo Rollouts does without a router. Either way never before a stable
    replica is ready, or nothing would serve (a stable that lost its pods meanwhile)."""
    keep = total > 0 and stable_ready == 0
    if gateway:
        canary = canary_replicas if keep or not scale_down else 0
        return Split(total, canary, 0, True, _route(0))
    canary = canary_replicas if keep else 0
    effective = ready_share(min(canary_ready, canary), stable_ready)
    return Split(total, canary, effective, canary == 0, _route(0))


def ready_of(observed: Mapping[Slot, SlotObserved], slot: Slot | None, revision: str | None) -> int:
    """Ready replicas of `slot` that run `revision` (0 when it runs another or is not there)."""
    seen = observed.get(slot) if slot is not None else None
    return seen.ready if seen is not None and seen.exists and seen.revision == revision else 0


def of_rollout(
    s: RevisionsStatus,
    spec: CanarySpec | None,
    observed: Mapping[Slot, SlotObserved],
    total: int,
    now: datetime,
    route_ready: bool,
) -> Split:
    """The split the rollout's state asks for, given the slots as observed."""
    if s.canary is None or spec is None:
        return Split(total, 0, 0, True, _route(0))
    canary_ready = ready_of(observed, s.canary_slot, s.canary)
    stable_ready = ready_of(observed, s.stable_slot, s.stable)
    gateway = spec.traffic_routing == TrafficRouting.GATEWAY_API
    if s.phase == RolloutPhase.ABORTED:
        assert s.aborted_at is not None
        seen = observed.get(s.canary_slot) if s.canary_slot is not None else None
        replicas = seen.replicas if seen is not None and seen.exists else 0
        over = now >= s.aborted_at + timedelta(seconds=spec.abort_scale_down_delay_seconds)
        return withdrawn(total, gateway, replicas, canary_ready, stable_ready, over)
    steps = [step.weight for step in spec.steps]
    index = s.canary_step or 0
    weight = 100 if s.phase == RolloutPhase.PROMOTING else steps[index]
    if gateway:
        return gateway_api(total, weight, steps[: index + 1], canary_ready, route_ready)
    return replica_ratio(total, weight, canary_ready, stable_ready)
