"""PLACEHOLDER (part D1, issue 24): part A owns this module and writes the real one; the
integrator replaces this file with A's. Only the names and shapes of the shared contract are here
so that build Jobs can use them: an init container of the operator's own image copies the
standard-library-only part of the package into an emptyDir, and the NVIDIA containers run it with
their own python3 (PYTHONPATH)."""

from __future__ import annotations

from typing import Any

INJECT_VOLUME = "llm-operator-lib"
INJECT_PATH = "/var/run/llm-operator/lib"


def inject_init_container(operator_image: str) -> dict[str, Any]:
    # PLACEHOLDER: A's version decides the exact copy command and file list.
    return {
        "name": "inject",
        "image": operator_image,
        "command": ["llm-operator", "inject", INJECT_PATH],
        "volumeMounts": [inject_mount(read_only=False)],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
        },
    }


def inject_volume() -> dict[str, Any]:
    return {"name": INJECT_VOLUME, "emptyDir": {}}


def inject_mount(read_only: bool = True) -> dict[str, Any]:
    return {"name": INJECT_VOLUME, "mountPath": INJECT_PATH, "readOnly": read_only}


def python_path_env() -> dict[str, Any]:
    return {"name": "PYTHONPATH", "value": INJECT_PATH}
