"""Replica split per traffic routing: Argo Rollouts' rounding, stable shrinks only by ready canary
replicas, gateway-api keeps the stable full and gives route weight only to ready capacity."""

from __future__ import annotations

import pytest
from llm_operator.rollout import split


@pytest.mark.parametrize(
    ("total", "weight", "canary"),
    [
        (10, 10, 1),
        (10, 25, 3),  # 2.5 rounds half up, as Argo's tie rule
        (10, 24, 2),
        (10, 50, 5),
        (10, 99, 9),  # the stable keeps one for weights below 100
        (10, 100, 10),
        (10, 1, 1),  # at least one canary for weights 1-99
        (3, 10, 1),
        (3, 50, 2),
        (2, 90, 1),
        (1, 10, 1),  # one replica surges to two rather than hand all traffic to the canary
        (1, 100, 1),
        (0, 50, 0),
        (5, 0, 0),
    ],
)
def test_ratio_canary_replicas_follow_argo_rounding(total: int, weight: int, canary: int) -> None:
    assert split.ratio_canary_replicas(total, weight) == canary


@pytest.mark.parametrize(
    ("total", "weight", "canary"),
    [(10, 10, 1), (10, 11, 2), (3, 10, 1), (3, 50, 2), (1, 1, 1), (4, 100, 4), (0, 10, 0), (4, 0, 0)],
)
def test_gateway_canary_replicas_are_the_ceiling_share(total: int, weight: int, canary: int) -> None:
    assert split.gateway_canary_replicas(total, weight) == canary


@pytest.mark.parametrize(
    ("canary_ready", "stable", "weight", "reached"),
    [
        (0, 10, 0, False),  # nothing ready: the stable keeps every replica
        (1, 9, 10, False),
        (2, 8, 20, False),
        (3, 7, 30, True),
        (5, 7, 30, True),  # more ready than wanted (a lower step after a restart) count as wanted
    ],
)
def test_stable_shrinks_only_by_ready_canary_replicas(
    canary_ready: int, stable: int, weight: int, reached: bool
) -> None:
    s = split.replica_ratio(10, 30, canary_ready, stable_ready=10)
    assert (s.canary, s.stable, s.weight, s.reached) == (3, stable, weight, reached)
    assert s.route == {"stable": 100, "canary": 0}


def test_one_replica_keeps_one_stable_and_the_weight_in_effect_is_the_ready_share() -> None:
    s = split.replica_ratio(1, 10, canary_ready=1, stable_ready=1)
    assert (s.canary, s.stable, s.weight, s.reached) == (1, 1, 50, True)


def test_promotion_weight_drains_the_stable_as_the_canary_gets_ready() -> None:
    assert (split.replica_ratio(4, 100, 1, 4).stable, split.replica_ratio(4, 100, 4, 0).stable) == (3, 0)
    assert split.replica_ratio(4, 100, 4, 0).weight == 100


def test_gateway_keeps_the_stable_full_and_weights_only_ready_capacity() -> None:
    waiting = split.gateway_api(10, 50, [10, 50], canary_ready=1, route_ready=True)
    assert (waiting.stable, waiting.canary, waiting.route, waiting.reached) == (
        10,
        5,
        {"stable": 90, "canary": 10},
        False,
    )
    none = split.gateway_api(10, 10, [10], canary_ready=0, route_ready=True)
    assert none.route == {"stable": 100, "canary": 0} and none.weight == 0
    there = split.gateway_api(10, 50, [10, 50], canary_ready=5, route_ready=True)
    assert (there.route["canary"], there.weight, there.reached) == (50, 50, True)


def test_gateway_weight_is_not_in_effect_while_the_route_is_not_accepted() -> None:
    s = split.gateway_api(10, 50, [10, 50], canary_ready=5, route_ready=False)
    assert (s.route["canary"], s.weight, s.reached) == (50, 0, False)


@pytest.mark.parametrize(("stable_ready", "canary"), [(0, 3), (1, 0)])
def test_withdrawn_replica_ratio_removes_the_canary_once_a_stable_replica_serves(
    stable_ready: int, canary: int
) -> None:
    s = split.withdrawn(
        4, False, canary_replicas=3, canary_ready=3, stable_ready=stable_ready, scale_down=False
    )
    assert (s.stable, s.canary) == (4, canary)


@pytest.mark.parametrize(("scale_down", "canary"), [(False, 3), (True, 0)])
def test_withdrawn_gateway_keeps_canary_pods_until_the_delay_without_traffic(
    scale_down: bool, canary: int
) -> None:
    s = split.withdrawn(4, True, canary_replicas=3, canary_ready=3, stable_ready=4, scale_down=scale_down)
    assert (s.stable, s.canary, s.weight, s.route) == (4, canary, 0, {"stable": 100, "canary": 0})


@pytest.mark.parametrize(("stable_ready", "canary"), [(0, 3), (1, 0)])
def test_withdrawn_gateway_keeps_canary_pods_past_the_delay_while_the_stable_has_none_ready(
    stable_ready: int, canary: int
) -> None:
    # The stable lost its pods after the abort (hypothesis found it): removing the canary's
    # would leave nothing running; it goes once a stable replica is ready.
    s = split.withdrawn(
        4, True, canary_replicas=3, canary_ready=3, stable_ready=stable_ready, scale_down=True
    )
    assert (s.stable, s.canary, s.weight) == (4, canary, 0)
