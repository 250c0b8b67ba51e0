"""What GitOps tools make of an LLMDeployment, computed by their own code.

- kstatus: `sigs.k8s.io/cli-utils/pkg/kstatus/status.Compute` (Flux's health checks, Helm 4
  `--wait`, kpt), built as the tiny Go tool e2e/cluster/tools/kstatus.
- Argo CD: our health.lua and actions under charts/llm-operator/argocd/, run the way Argo CD runs a
  script from argocd-cm (e2e/cluster/tools/argocd-lua: gopher-lua with Argo CD's libraries).

Both tools come from `e2e/cluster/build-tools.sh gitops` (cached by version; a cold build takes
about two minutes). From an e2e test, on the live object:

    assert_kstatus(kubectl.get("llmd", name, namespace), "InProgress")
    assert argocd_health(kubectl.get("llmd", name, namespace))["status"] == "Suspended"
"""

from __future__ import annotations

import json
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

from e2e.cluster.components import BUILD_TOOLS

REPO = Path(__file__).resolve().parents[1]
ARGOCD = REPO / "charts" / "llm-operator" / "argocd" / "llmoperator.io" / "LLMDeployment"
KSTATUSES = ("InProgress", "Failed", "Current", "Terminating", "NotFound", "Unknown")
HEALTHS = ("Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown")


class ToolError(Exception):
    """A GitOps tool could not be built or could not judge the object."""


@cache
def tool(name: str) -> Path:
    """Path of `kstatus` or `argocd-lua`, built (or reused from the cache) by build-tools.sh."""
    proc = subprocess.run(["bash", str(BUILD_TOOLS), "gitops"], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise ToolError(f"{BUILD_TOOLS.name} gitops failed: {proc.stderr.strip()[-2000:]}")
    for directory in proc.stdout.split():
        if (Path(directory) / name).is_file():
            return Path(directory) / name
    raise ToolError(f"{BUILD_TOOLS.name} gitops built no {name} (printed {proc.stdout!r})")


def _run(args: list[str], obj: dict[str, Any]) -> Any:
    proc = subprocess.run(args, input=json.dumps(obj), capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise ToolError(f"{Path(args[0]).name} {' '.join(args[1:])}: {proc.stderr.strip()}")
    return json.loads(proc.stdout)


def kstatus(obj: dict[str, Any]) -> tuple[str, str]:
    """(status, message) as kstatus computes them: InProgress, Failed, Current, Terminating, ..."""
    result = _run([str(tool("kstatus"))], obj)
    return result["status"], result["message"]


def assert_kstatus(obj: dict[str, Any] | None, expected: str, message: str | None = None) -> None:
    """The e2e hook: `obj` (e.g. kubectl get -o json of the live object) has kstatus `expected`,
    and its message contains `message` when given."""
    assert expected in KSTATUSES, f"{expected!r} is not a kstatus status"
    assert obj is not None, "the object does not exist"
    got, said = kstatus(obj)
    where = f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}"
    assert got == expected, (
        f"kstatus of {where} is {got} ({said!r}), expected {expected}; status: {obj.get('status')}"
    )
    if message is not None:
        assert message in said, f"kstatus message of {where} is {said!r}, expected it to contain {message!r}"


def argocd_lua(kind: str, script: Path, obj: dict[str, Any]) -> Any:
    """Run one script (kind: health | discovery | action) on obj as Argo CD does."""
    return _run([str(tool("argocd-lua")), kind, str(script)], obj)


def argocd_health(obj: dict[str, Any]) -> dict[str, str]:
    """{"status": Healthy | Progressing | Degraded | Suspended | ..., "message": ...}"""
    result: dict[str, str] = argocd_lua("health", ARGOCD / "health.lua", obj)
    return result


def argocd_actions(obj: dict[str, Any]) -> dict[str, bool]:
    """{action name: enabled} as Argo CD's UI offers them for obj."""
    return {
        a["name"]: not a["disabled"]
        for a in argocd_lua("discovery", ARGOCD / "actions" / "discovery.lua", obj)
    }


def argocd_action(obj: dict[str, Any], action: str) -> dict[str, Any]:
    """The object as the action leaves it (what Argo CD patches the live object to)."""
    result: dict[str, Any] = argocd_lua("action", ARGOCD / "actions" / action / "action.lua", obj)
    return result
