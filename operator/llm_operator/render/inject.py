"""How the operator's own code reaches NVIDIA's images unchanged: an init container of the operator
image copies the standard-library-only part of the package (llm_operator/inject.py says which)
into an emptyDir, and the main container runs it with the image's python3 from there.

Serving pods (render/pod.py) run `python3 -m llm_operator.runtime.launcher`, build Jobs
`python3 -m llm_operator.engine.build`. What the main container runs is therefore always the
operator's version: an operator upgrade rolls the serving pods (the init container's image is in
their template).
"""

from __future__ import annotations

from typing import Any

INJECT_VOLUME = "llm-operator-lib"
INJECT_PATH = "/var/run/llm-operator/lib"
# Python's start plus a copy of ~200 KB of files; the limit only bounds a runaway.
_RESOURCES = {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}}


def inject_init_container(operator_image: str) -> dict[str, Any]:
    return {
        "name": INJECT_VOLUME,
        "image": operator_image,
        # The operator image has no shell: its python copies (llm_operator/inject.py).
        "command": ["python3", "-m", "llm_operator.inject", INJECT_PATH],
        "volumeMounts": [{"name": INJECT_VOLUME, "mountPath": INJECT_PATH}],
        "resources": {k: dict(v) for k, v in _RESOURCES.items()},
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
        },
    }


def inject_volume() -> dict[str, Any]:
    return {"name": INJECT_VOLUME, "emptyDir": {"sizeLimit": "16Mi"}}


def inject_mount() -> dict[str, Any]:
    """The main container's view: read-only, so what it runs is what the init container copied."""
    return {"name": INJECT_VOLUME, "mountPath": INJECT_PATH, "readOnly": True}


def python_path_env() -> dict[str, Any]:
    return {"name": "PYTHONPATH", "value": INJECT_PATH}
