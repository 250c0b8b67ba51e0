"""Condition builders the status reducer (status.py) and its parts share."""

from __future__ import annotations

from typing import Any

from llm_operator.api.v1alpha1 import Phase

FAILED_POD = "Failed"  # pod problem prefix of a build attempt that exited with an error
LAUNCHER_REFUSED = "LauncherRefused"  # a serving pod's launcher exited 78: no restart will help


def cond(type_: str, ok: bool, reason: str, message: str, generation: int) -> dict[str, Any]:
    return {
        "type": type_,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    }


def available(serving: bool) -> str:
    return "MinimumReplicasAvailable" if serving else "NoReplicasAvailable"


def stalled(reason: str, message: str, serving: bool, g: int) -> tuple[list[dict[str, Any]], Phase]:
    """Progress needs the user; whatever serves keeps serving (Degraded, not torn down)."""
    conds = [
        cond("Ready", False, reason, message, g),
        cond("Reconciling", False, reason, "", g),
        cond("Stalled", True, reason, message, g),
        cond("Progressing", False, reason, message, g),
        cond(
            "Degraded",
            serving,
            "StalledWhileServing" if serving else "NotServing",
            "the previous revision keeps serving until this is fixed" if serving else "",
            g,
        ),
    ]
    return conds, Phase.DEGRADED if serving else Phase.FAILED
