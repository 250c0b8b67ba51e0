"""How the operator's own code reaches NVIDIA's images unchanged: an init container of the launcher
image copies the standard-library-only part of the package, and the front door with the h11 it
needs (llm_operator/inject.py says which), into an emptyDir, and the main container runs it with
the image's python3 from there.

Serving pods (render/pod.py) run `python3 -m llm_operator.runtime.launcher`, build Jobs
`python3 -m llm_operator.engine.build`. The launcher image holds exactly those files and a static
busybox that copies them, and is tagged with their content hash (inject.content_tag, computed by
the operator from its own installed package; images/builder/launcher.py builds it). So what the
main container runs is always the operator's version, and an operator upgrade rolls serving pods
only when those files changed: an upgrade that changes anything else (the controller, the API,
the operator image) renders the same init container, hence the same pod template.
"""

from __future__ import annotations

from typing import Any

from llm_operator.inject import copy_command

INJECT_VOLUME = "llm-operator-lib"
INJECT_PATH = "/var/run/llm-operator/lib"
# busybox copying ~200 KB of files; the limit only bounds a runaway.
_RESOURCES = {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}}


def inject_init_container(launcher_image: str) -> dict[str, Any]:
    return {
        "name": INJECT_VOLUME,
        "image": launcher_image,
        # Spelled out rather than the image's entry point: the template says what runs.
        "command": copy_command(INJECT_PATH),
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
