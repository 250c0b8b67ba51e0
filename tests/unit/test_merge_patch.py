"""The status patch removes what went away, nested keys included (a finished canary's fields)."""

from __future__ import annotations

from typing import Any

from llm_operator.controller.cluster.kube import merge_patch


def apply(target: Any, patch: Any) -> Any:
    """RFC 7386, as the API server applies a merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = apply(out.get(k), v)
    return out


def test_a_rolled_back_canary_leaves_no_field_behind() -> None:
    old = {
        "phase": "Progressing",
        "engine": {"ready": True},
        "revisions": {"stable": "aaa", "canary": "bbb", "canarySlot": "b", "analysis": {"phase": "Running"}},
        "conditions": [{"type": "Ready", "status": "False"}],
    }
    new = {"phase": "Ready", "revisions": {"stable": "aaa", "phase": "Stable"}, "conditions": []}
    assert apply(old, merge_patch(old, new)) == new


def test_nested_values_that_stay_are_kept_and_changed_ones_replaced() -> None:
    old = {"revisions": {"analysis": {"metrics": [{"name": "errorRate", "failed": 1}], "phase": "Running"}}}
    new = {"revisions": {"analysis": {"metrics": [{"name": "errorRate", "failed": 2}], "phase": "Failed"}}}
    assert apply(old, merge_patch(old, new)) == new
