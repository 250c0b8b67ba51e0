"""The key of Triton's admin APIs: one Secret per LLMDeployment (runtime/commands.py says which
APIs and why).

Made once like the launch identity (controller/secrets/owned_secret.py), owned by the LLMDeployment, its name
carrying the UID, never read back, logged or rendered: the leader's container gets it through
`env[].valueFrom.secretKeyRef` (render/serving.py), and `llm-operator render` shows only that
reference. An admin reads it with kubectl (docs/runtime.md "Triton's admin APIs").
"""

from __future__ import annotations

import secrets
from typing import Any

from llm_operator.api.v1alpha1 import LLMDeployment
from llm_operator.contract import ADMIN_KEY_SECRET_KEY
from llm_operator.controller.cluster.kube import KubeApi
from llm_operator.controller.secrets.owned_secret import OwnedSecret, secret_of
from llm_operator.plan.types import PlanningError
from llm_operator.render import names

REASON = "AdminKeySecretNotOwned"


def admin_key_secret(ld: LLMDeployment) -> dict[str, Any]:
    name = names.admin_key_secret(ld.name, ld.metadata.get("uid", ""))
    # 256 bits, hex: Triton's flag syntax (APIS:HEADER=KEY) needs no quoting of it.
    return secret_of(ld, name, "admin-key", {ADMIN_KEY_SECRET_KEY: secrets.token_hex(32)})


def foreign_secret_message(name: str) -> str:
    return (
        f'Secret "{name}" exists but this LLMDeployment did not create it, so its pods are not '
        "started with its key: delete that Secret and the operator creates its own."
    )


class AdminKeys(OwnedSecret):
    """Every deployment's admin-key Secret, made before its pods need it."""

    def __init__(self, kube: KubeApi) -> None:
        super().__init__(
            kube,
            admin_key_secret,
            "adminKeySecret",
            lambda name: PlanningError(REASON, foreign_secret_message(name)),
        )
