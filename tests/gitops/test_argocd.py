"""Argo CD health check and rollout actions (charts/llm-operator/argocd/), under Argo CD's runtime.

Every case of health_test.yaml and actions/action_test.yaml (Argo CD's own layout for built-in
customizations) runs through e2e/cluster/tools/argocd-lua: gopher-lua opened the way Argo CD
opens it for a script from argocd-cm (no string or math library, an os with time and date only).
The test inputs are written from tests/gitops/cases.py; argocd-cm.yaml from the scripts.
Regenerate both after an intended change: UPDATE_GOLDEN=1 (then review the diff).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.gitops import ARGOCD, HEALTHS, argocd_action, argocd_actions, argocd_health, argocd_lua
from tests.gitops.cases import cases

ACTION = "llmoperator.io/rollout-action"
CM = ARGOCD.parents[1] / "argocd-cm.yaml"
CM_KEY = "llmoperator.io_LLMDeployment"
HEALTH_TESTS = yaml.safe_load((ARGOCD / "health_test.yaml").read_text())["tests"]
ACTION_TESTS = yaml.safe_load((ARGOCD / "actions" / "action_test.yaml").read_text())


class _Dumper(yaml.SafeDumper):
    pass


def _text(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|" if "\n" in data else None)


_Dumper.add_representer(str, _text)


def _dump(obj: Any) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=100)


def _argocd_cm() -> str:
    actions = {
        "discovery.lua": (ARGOCD / "actions" / "discovery.lua").read_text(),
        "definitions": [
            {"name": d.name, "action.lua": (d / "action.lua").read_text()}
            for d in sorted((ARGOCD / "actions").iterdir())
            if (d / "action.lua").is_file()
        ],
    }
    data = {
        f"resource.customizations.health.{CM_KEY}": (ARGOCD / "health.lua").read_text(),
        f"resource.customizations.actions.{CM_KEY}": _dump(actions),
    }
    header = (
        "# Argo CD health check and rollout actions for LLMDeployment (docs/rollouts.md, GitOps),\n"
        "# written from argocd/llmoperator.io/LLMDeployment/ by tests/gitops. Merge it into argocd-cm:\n"
        "#   kubectl -n argocd patch configmap argocd-cm --type merge --patch-file argocd-cm.yaml\n"
    )
    return header + _dump({"data": data})


def expected_files() -> dict[Path, str]:
    """Every generated file: test inputs from cases.py, action outputs, the argocd-cm patch."""
    all_cases = cases()
    files = {ARGOCD / t["inputPath"]: _dump(all_cases[Path(t["inputPath"]).stem].obj) for t in HEALTH_TESTS}
    actions = ARGOCD / "actions"
    for t in ACTION_TESTS["discoveryTests"] + ACTION_TESTS["actionTests"]:
        files[actions / t["inputPath"]] = _dump(all_cases[Path(t["inputPath"]).stem].obj)
    for t in ACTION_TESTS["actionTests"]:
        out = all_cases[Path(t["inputPath"]).stem].obj
        out["metadata"]["annotations"] = {
            **out["metadata"].get("annotations", {}),
            ACTION: f"{t['action']}/0",
        }
        files[actions / t["expectedOutputPath"]] = _dump(out)
    files[CM] = _argocd_cm()
    return files


def test_generated_files_are_current() -> None:
    files = expected_files()
    if os.environ.get("UPDATE_GOLDEN"):
        for directory in (ARGOCD / "testdata", ARGOCD / "actions" / "testdata"):
            for stale in set(directory.glob("*.yaml")) - set(files):
                stale.unlink()
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    for path, text in files.items():
        assert path.is_file() and path.read_text() == text, (
            f"{path} is stale: UPDATE_GOLDEN=1, review the diff"
        )
    unused = {p for d in ("testdata", "actions/testdata") for p in (ARGOCD / d).glob("*.yaml")} - set(files)
    assert not unused, f"testdata no test uses: {sorted(map(str, unused))}"


def test_every_case_with_an_argocd_health_is_in_health_test_yaml() -> None:
    listed = {Path(t["inputPath"]).stem: t["healthStatus"]["status"] for t in HEALTH_TESTS}
    assert listed == {n: c.health for n, c in cases().items() if c.health is not None}
    assert set(listed.values()) == {"Healthy", "Progressing", "Degraded", "Suspended"}


@pytest.mark.parametrize("test", HEALTH_TESTS, ids=lambda t: t["inputPath"])
def test_health(test: dict[str, Any]) -> None:
    obj = yaml.safe_load((ARGOCD / test["inputPath"]).read_text())
    got = argocd_lua("health", ARGOCD / "health.lua", obj)
    assert got["status"] in HEALTHS
    assert got == test["healthStatus"]


@pytest.mark.parametrize("test", ACTION_TESTS["discoveryTests"], ids=lambda t: t["inputPath"])
def test_discovery(test: dict[str, Any]) -> None:
    obj = yaml.safe_load((ARGOCD / "actions" / test["inputPath"]).read_text())
    got = argocd_lua("discovery", ARGOCD / "actions" / "discovery.lua", obj)
    assert got == sorted(test["result"], key=lambda a: a["name"])


@pytest.mark.parametrize(
    "test", ACTION_TESTS["actionTests"], ids=lambda t: f"{t['action']}/{Path(t['inputPath']).stem}"
)
def test_action(test: dict[str, Any]) -> None:
    actions = ARGOCD / "actions"
    obj = yaml.safe_load((actions / test["inputPath"]).read_text())
    before = time.time()
    got = argocd_lua("action", actions / test["action"] / "action.lua", obj)
    # The token is os.time() of Argo CD's sandbox: the same action asked twice differs.
    token = re.fullmatch(rf"{re.escape(test['action'])}/(\d+)", got["metadata"]["annotations"][ACTION])
    assert token and before - 1 <= int(token[1]) <= time.time() + 1, got["metadata"]["annotations"]
    got["metadata"]["annotations"][ACTION] = f"{test['action']}/0"
    assert got == yaml.safe_load((actions / test["expectedOutputPath"]).read_text())


def test_argocd_cm_holds_the_scripts_where_argo_cd_reads_them() -> None:
    data = yaml.safe_load(CM.read_text())["data"]
    assert data[f"resource.customizations.health.{CM_KEY}"] == (ARGOCD / "health.lua").read_text()
    actions = yaml.safe_load(data[f"resource.customizations.actions.{CM_KEY}"])
    assert actions["discovery.lua"] == (ARGOCD / "actions" / "discovery.lua").read_text()
    defined = {d["name"]: d["action.lua"] for d in actions["definitions"]}
    assert set(defined) == {"promote", "promote-full", "abort", "retry"}
    for name, script in defined.items():
        assert script == (ARGOCD / "actions" / name / "action.lua").read_text()


def test_e2e_hooks_read_a_live_object_as_argo_cd_would() -> None:
    paused = cases()["canary_paused"].obj
    assert argocd_health(paused)["status"] == "Suspended"
    assert argocd_actions(paused) == {"promote": True, "promote-full": True, "abort": True, "retry": False}
    annotated = argocd_action(paused, "abort")["metadata"]["annotations"][ACTION]
    assert annotated.startswith("abort/") and annotated != paused["metadata"]["annotations"][ACTION]
