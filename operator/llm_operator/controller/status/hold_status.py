"""Scale to zero in status: does the router's hold cover the deployment's cold start? (pure)

At autoscaling.minReplicas 0 a request that arrives at zero replicas waits in the router for the
hold (render/scale_to_zero.py): a hold no longer than the cold start (status.lastColdStart) answers
every such request with a 503 before a replica is Ready, at every wake-up. HoldCoversColdStart says
so, naming both figures and what to change; False posts a Warning Event (status.py). It never makes
the deployment Degraded: above zero it serves as before, and the router's waker refuses held
requests at once while a deployment at zero is Degraded (llm_operator/waker/stall.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llm_operator.api.v1alpha1 import MAX_HOLD_SECONDS, LLMDeployment, ScaleToZeroSpec
from llm_operator.controller.status.conditions import cond
from llm_operator.render.scale_to_zero import derived_hold, hold_seconds, running_hold

CONDITION = "HoldCoversColdStart"
NOT_MEASURED = "ColdStartNotMeasured"
DERIVED = "HoldDerived"
SET = "HoldSet"
BELOW = "HoldBelowColdStart"
ABOVE_MAX = "ColdStartAboveMaxHold"
FIELD = "autoscaling.scaleToZero.holdSeconds"


@dataclass(frozen=True)
class HoldObserved:
    zero: ScaleToZeroSpec
    running: int | None = None  # the derived hold the router's ConfigMap records (scale_to_zero.running_hold)


def observe(ld: LLMDeployment, router_config: dict[str, Any] | None) -> HoldObserved | None:
    """None without scale to zero. `router_config`: the router's ConfigMap as last applied."""
    zero = ld.spec.autoscaling.zero if ld.spec.autoscaling is not None else None
    return None if zero is None else HoldObserved(zero, running_hold(router_config))


def condition(h: HoldObserved, last_cold_start: dict[str, Any] | None, g: int) -> dict[str, Any]:
    """`last_cold_start`: status.lastColdStart as this status writes it. The hold judged is the one a
    request held at zero gets: a derived one as the operator applies it once the deployment is at
    zero (hold_seconds: the router's, raised to the last start's if that needs more), which the
    router may not run yet."""
    set_s = h.zero.hold_seconds
    if last_cold_start is None:
        held = f"{set_s} s ({FIELD})" if set_s is not None else f"{derived_hold(None)} s (no cold start yet)"
        said = f"the router holds a request up to {held}"
        return {**cond(CONDITION, False, NOT_MEASURED, said, g), "status": "Unknown"}
    cold, pod = int(last_cold_start["totalSeconds"]), last_cold_start.get("podName", "")
    started = f"the last cold start (pod {pod}) took {cold} s"
    hold, derived = hold_seconds(h.zero, cold, h.running, at_zero=True), derived_hold(cold)
    if hold > cold and set_s is not None:
        return cond(CONDITION, True, SET, f"{FIELD} is {set_s} s, and {started}", g)
    if hold > cold:
        said = f"{started}: the router holds a request at zero replicas up to {hold} s, derived from "
        if hold > derived:  # the router's, from a slower start: never lowered on its own
            said += f"a slower cold start before it (set {FIELD} for a shorter hold than that)"
        else:
            said += "it"
        if h.running is not None and h.running < hold:
            said += f" (it holds {h.running} s until the deployment is next at zero replicas)"
        return cond(CONDITION, True, DERIVED, said, g)
    refused = "a request that arrives at zero replicas gets a 503 before a replica is Ready"
    if cold >= MAX_HOLD_SECONDS:
        fix = (
            "shorten the cold start (pre-pull the serving image on the nodes, a model cache: "
            'docs/autoscaling.md, "What a GPU cold start adds"), or set autoscaling.minReplicas 1'
        )
        ceiling = f"the router holds a request at most {MAX_HOLD_SECONDS} s (the ceiling of {FIELD})"
        return cond(CONDITION, False, ABOVE_MAX, f"{started}, and {ceiling}: {refused}; {fix}", g)
    # Only a hold set in the spec falls short of a start under the ceiling.
    fix = f"remove {FIELD} to have it derived from the cold start ({derived} s), or set it to that or more"
    return cond(CONDITION, False, BELOW, f"{FIELD} is {set_s} s, and {started}: {refused}; {fix}", g)
