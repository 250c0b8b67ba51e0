"""The SSH identity of a deployment's multi-node groups: one Secret per LLMDeployment.

The leader's mpirun logs in to its workers' sshd with this key pair (docs/launcher-and-engines.md).
The key is made once, owned by the LLMDeployment (the garbage collector removes it with it) and
never read back, logged or rendered: `llm-operator render` shows only the volume that mounts it.
Its name carries the deployment's UID, so a deployment deleted and created again under the same
name never meets the Secret of its predecessor that the garbage collector has yet to remove.
"""

from __future__ import annotations

from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from llm_operator import labels as L
from llm_operator.api.v1alpha1 import LLMDeployment
from llm_operator.contract import SSH_PRIVATE_KEY, SSH_PUBLIC_KEY
from llm_operator.controller.kube import KubeApi
from llm_operator.plan.types import Plan
from llm_operator.render import names
from llm_operator.render.children import owner_reference


def needs_ssh(plan: Plan) -> bool:
    return any(p.pods_per_replica > 1 for p in plan.pools)


def key_pair() -> dict[str, str]:
    """A fresh ed25519 key pair as Secret stringData: the private key and its authorized_keys line."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return {SSH_PRIVATE_KEY: private.decode(), SSH_PUBLIC_KEY: public.decode() + " llm-operator\n"}


def ssh_secret(ld: LLMDeployment) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": names.ssh_secret(ld.name, ld.metadata.get("uid", "")),
            "namespace": ld.namespace,
            "labels": L.common_labels(ld.name, "ssh-identity"),
            "ownerReferences": [owner_reference(ld)],
        },
        "type": "Opaque",
        "stringData": key_pair(),
    }


class SshIdentities:
    """Creates each deployment's Secret once. The operator may create Secrets but never read one
    (docs/helm.md), so existence is learnt from the create itself: AlreadyExists means an earlier
    run made it (the name carries the deployment's UID). Remembered, so a steady reconcile sends
    nothing; after a restart, one create per multi-node deployment."""

    def __init__(self, kube: KubeApi) -> None:
        self.kube = kube
        self._ensured: set[tuple[str, str]] = set()

    async def ensure(self, ld: LLMDeployment) -> None:
        key = (ld.namespace, ld.name)
        if key not in self._ensured:
            await self.kube.create(ssh_secret(ld))
            self._ensured.add(key)

    def forget(self, key: tuple[str, str]) -> None:
        """Create again on the next reconcile (the deployment is gone, or a group was recreated:
        a deleted Secret is one reason groups fail)."""
        self._ensured.discard(key)
