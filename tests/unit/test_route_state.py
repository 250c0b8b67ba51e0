"""What the operator reads from its HTTPRoute's status: every parent accepted it, one refused it
(in the gateway's own words), or nobody answered for a parent (no such Gateway). Only answers about
the route's current generation count: an older one says nothing of the weights now asked for."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from llm_operator.api.v1alpha1 import LLMDeployment
from llm_operator.controller.rollout.rollout import ROUTE_GRACE_SECONDS, route_state

NOW = datetime(2026, 11, 23, 20, 0, tzinfo=UTC)
LD = LLMDeployment.model_validate(
    {
        "metadata": {"name": "tiny", "namespace": "ns"},
        "spec": {"model": {"name": "m", "source": {"uri": "builtin://tiny-llama"}}},
    }
)
REF = {"name": "llmop", "namespace": "gateway-system", "sectionName": "http"}


def stamp(age: float) -> str:
    return (NOW - timedelta(seconds=age)).strftime("%Y-%m-%dT%H:%M:%SZ")


def children(
    parents: list[dict[str, Any]] | None, age: float = 5, generation: int = 3
) -> dict[tuple[str, str, str], Any]:
    route = {
        "metadata": {
            "name": "tiny",
            "namespace": "ns",
            "creationTimestamp": stamp(age),
            "generation": generation,
        },
        "spec": {"parentRefs": [REF]},
        "status": {"parents": parents or []},
    }
    return {("HTTPRoute", "ns", "tiny"): route}


def answer(
    accepted: str, reason: str, message: str = "", generation: int = 3, resolved: dict[str, Any] | None = None
) -> dict[str, Any]:
    cond = {"type": "Accepted", "status": accepted, "reason": reason, "message": message}
    conds = [cond, *([resolved] if resolved else [])]
    for c in conds:
        c["observedGeneration"] = generation
    return {"parentRef": REF, "controllerName": "traefik.io/gateway-controller", "conditions": conds}


def test_no_route_yet_is_not_accepted_and_no_problem() -> None:
    assert route_state({}, LD, NOW) == (False, None)


def test_accepted_by_its_parent() -> None:
    assert route_state(children([answer("True", "Accepted")]), LD, NOW) == (True, None)


def test_refused_in_the_gateways_words_or_its_reason() -> None:
    ok, problem = route_state(children([answer("False", "NoMatchingParent")]), LD, NOW)
    assert not ok and problem is not None
    assert "gateway-system/llmop (listener http)" in problem and "NoMatchingParent" in problem


def test_silence_is_waited_for_then_reported() -> None:
    assert route_state(children(None, age=5), LD, NOW) == (False, None)
    ok, problem = route_state(children(None, age=ROUTE_GRACE_SECONDS + 1), LD, NOW)
    assert not ok and problem is not None and "check that the Gateway exists" in problem


def test_an_answer_about_an_earlier_generation_is_not_an_acceptance_of_this_one() -> None:
    assert route_state(children([answer("True", "Accepted", generation=2)]), LD, NOW) == (False, None)
    # nor is an earlier refusal a problem now: the route changed since
    assert route_state(children([answer("False", "NoMatchingParent", generation=2)]), LD, NOW) == (
        False,
        None,
    )


def test_a_backend_whose_endpointslices_do_not_exist_yet_is_waited_for_then_reported() -> None:
    def missing(age: float) -> dict[str, Any]:
        return {"type": "ResolvedRefs", "status": "False", "reason": "BackendNotFound",
                "message": "Cannot load HTTPBackendRef ns/tiny-canary: endpointslices not found",
                "lastTransitionTime": stamp(age)}  # fmt: skip

    fresh = children([answer("True", "Accepted", resolved=missing(2))])
    assert route_state(fresh, LD, NOW) == (False, None)
    ok, problem = route_state(
        children([answer("True", "Accepted", resolved=missing(ROUTE_GRACE_SECONDS + 1))]), LD, NOW
    )
    assert not ok and problem is not None and "BackendNotFound" in problem and "tiny-canary" in problem
