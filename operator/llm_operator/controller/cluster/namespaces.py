"""Which namespaces this operator acts in (`llm-operator run --namespace`, repeatable).

Names: LLMDeployments and children are watched in those namespaces only, with permissions that
can be granted there alone (the chart's `watchNamespaces`). Patterns, kopf's syntax (globs with
`*` and `?`, `!` excluding, comma-separated; `--namespace '!team-*'` is every namespace but those):
LLMDeployments and children are watched cluster-wide, as with no option, and the events of
namespaces that do not match are dropped (kopf's own matcher), with the permissions of
`--all-namespaces`. Not kopf's own namespace patterns: those start a watch per matching namespace,
which ends with its namespace before the deployments' DELETED events, and one of them once saw a
new deployment only when its namespace was deleted, 240 s later (make test, 2026-11-30).
No option: every namespace.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

# kopf's matcher, the one that picks the LLMDeployments: children are filtered by the same rules.
from kopf._cogs.structs.references import NamespaceName, match_namespace

OnEvent = Callable[[str, dict[str, Any]], Awaitable[None]]
PATTERN_CHARACTERS = frozenset("*?!,[")


def is_pattern(namespace: str) -> bool:
    return not PATTERN_CHARACTERS.isdisjoint(namespace)


@dataclass(frozen=True)
class NamespaceScope:
    namespaces: tuple[str, ...]  # empty: every namespace

    @property
    def patterned(self) -> bool:
        return any(is_pattern(ns) for ns in self.namespaces)

    @property
    def watches(self) -> tuple[str | None, ...]:
        """One watch per named namespace; None (one cluster-wide watch) for all or for patterns."""
        return self.namespaces if self.namespaces and not self.patterned else (None,)

    def includes(self, namespace: str) -> bool:
        return not self.namespaces or any(
            match_namespace(NamespaceName(namespace), ns) for ns in self.namespaces
        )

    def only_in_scope(self, on_event: OnEvent) -> OnEvent:
        """`on_event` for the objects of namespaces in scope: a cluster-wide watch of a patterned
        scope also sees the others' (another operator's, a team's left out)."""
        if not self.patterned:
            return on_event

        async def filtered(event: str, obj: dict[str, Any]) -> None:
            if self.includes(obj.get("metadata", {}).get("namespace", "")):
                await on_event(event, obj)

        return filtered
