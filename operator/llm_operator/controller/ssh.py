"""The SSH identity of a deployment's multi-node groups: one Secret per LLMDeployment.

The leader's mpirun logs in to its workers' sshd with this key pair (docs/launcher-and-engines.md).
The key is made once, owned by the LLMDeployment (the garbage collector removes it with it) and
never read back, logged or rendered: `llm-operator render` shows only the volume that mounts it.
"""

from __future__ import annotations

from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from llm_operator import labels as L
from llm_operator.api.v1alpha1 import LLMDeployment
from llm_operator.controller.kube import KubeApi
from llm_operator.plan.types import Plan
from llm_operator.render import names
from llm_operator.render.children import owner_reference
from llm_operator.runtime.launcher import SSH_KEY


def needs_ssh(plan: Plan) -> bool:
    return any(p.pods_per_replica > 1 for p in plan.pools)


def key_pair() -> dict[str, str]:
    """A fresh ed25519 key pair as Secret stringData: the private key and its authorized_keys line."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return {SSH_KEY: private.decode(), f"{SSH_KEY}.pub": public.decode() + " llm-operator\n"}


def ssh_secret(ld: LLMDeployment) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": names.ssh_secret(ld.name),
            "namespace": ld.namespace,
            "labels": L.common_labels(ld.name, "ssh-identity"),
            "ownerReferences": [owner_reference(ld)],
        },
        "type": "Opaque",
        "stringData": key_pair(),
    }


class SshIdentities:
    """Makes each deployment's Secret once. Known Secrets are remembered, so a steady reconcile
    sends no request; after a restart one read per multi-node deployment confirms it."""

    def __init__(self, kube: KubeApi) -> None:
        self.kube = kube
        self._ensured: set[tuple[str, str]] = set()

    async def ensure(self, ld: LLMDeployment) -> str | None:
        """None when the deployment's Secret exists and is ours; else why it cannot be used."""
        key = (ld.namespace, ld.name)
        if key in self._ensured:
            return None
        name = names.ssh_secret(ld.name)
        owners = await self.kube.secret_owners(ld.namespace, name)
        if owners is None:
            await self.kube.create(ssh_secret(ld))
        elif ld.metadata.get("uid", "") not in owners:
            return (
                f"Secret {ld.namespace}/{name} exists and is not owned by this LLMDeployment: the "
                "operator keeps the multi-node SSH key there. Delete or rename that Secret."
            )
        self._ensured.add(key)
        return None

    def forget(self, key: tuple[str, str]) -> None:
        """Check again on the next reconcile (the deployment is gone, or a group was recreated)."""
        self._ensured.discard(key)
