"""`llm-operator run --namespace`: names watch those namespaces alone; kopf's patterns watch
children cluster-wide and act only on those in scope (controller/cluster/namespaces.py)."""

from __future__ import annotations

from typing import Any

import pytest
from llm_operator.controller.cluster.namespaces import NamespaceScope


def pod(namespace: str) -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {"name": "p", "namespace": namespace}}


async def delivered(scope: NamespaceScope, namespaces: list[str]) -> list[str]:
    seen: list[str] = []

    async def on_event(event: str, obj: dict[str, Any]) -> None:
        seen.append(obj["metadata"]["namespace"])

    on_scoped = scope.only_in_scope(on_event)
    for ns in namespaces:
        await on_scoped("ADDED", pod(ns))
    return seen


async def test_names_are_watched_each_and_nothing_is_filtered() -> None:
    scope = NamespaceScope(("team-a", "team-b"))
    assert scope.watches == ("team-a", "team-b")
    assert await delivered(scope, ["team-a", "team-b"]) == ["team-a", "team-b"]


async def test_every_namespace_is_one_watch() -> None:
    scope = NamespaceScope(())
    assert scope.watches == (None,)
    assert await delivered(scope, ["a", "kube-system"]) == ["a", "kube-system"]


@pytest.mark.parametrize(
    ("patterns", "inside", "outside"),
    [
        (("!own-*",), ["team-a", "default", "owner"], ["own-a", "own-"]),
        (("team-*", "prod"), ["team-a", "prod"], ["production", "dev", "a-team-b"]),
        (("team-*,!team-x",), ["team-a"], ["team-x", "other"]),
    ],
)
async def test_a_pattern_watches_cluster_wide_and_acts_only_in_its_namespaces(
    patterns: tuple[str, ...], inside: list[str], outside: list[str]
) -> None:
    scope = NamespaceScope(patterns)
    assert scope.watches == (None,), "one cluster-wide watch per kind, filtered"
    assert await delivered(scope, [*outside, *inside, *outside]) == inside
