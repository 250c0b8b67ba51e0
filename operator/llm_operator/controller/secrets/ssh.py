"""The SSH identity of a deployment's multi-node groups: one Secret per LLMDeployment.

The leader's mpirun logs in to its workers' sshd with the client key pair, and knows them by their
host key pair (docs/launcher-and-engines.md); pods mount only their role's half (render/pod.py).
The key is made once, owned by the LLMDeployment (the garbage collector removes it with it) and
never read back, logged or rendered: `llm-operator render` shows only the volume that mounts it.
Its name carries the deployment's UID, so a deployment deleted and created again under the same
name never meets the Secret of its predecessor that the garbage collector has yet to remove.
"""

from __future__ import annotations

from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from llm_operator.api.v1alpha1 import LLMDeployment
from llm_operator.contract import (
    SSH_AUTHORIZED_KEYS,
    SSH_HOST_ALIAS,
    SSH_HOST_KEY,
    SSH_KNOWN_HOSTS,
    SSH_PRIVATE_KEY,
)
from llm_operator.controller.cluster.kube import KubeApi
from llm_operator.controller.secrets.owned_secret import OwnedSecret, secret_of
from llm_operator.plan.types import Plan, PlanningError
from llm_operator.render import names


def needs_ssh(plan: Plan) -> bool:
    return any(p.pods_per_replica > 1 for p in plan.pools)


def _ed25519() -> tuple[str, str]:
    """A fresh ed25519 key pair: the OpenSSH private key and the public key's `ssh-ed25519 ...`."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private.decode(), public.decode()


def key_pair() -> dict[str, str]:
    """The Secret's stringData: the client key with its authorized_keys line, and the workers' host
    key with its known_hosts line. `restrict` turns off every forwarding, the agent, X11, a pty and
    ~/.ssh/rc for this key whatever sshd allows; the host key is pinned under one alias, as the
    leader reaches workers by names the operator does not know when it makes the key."""
    client, client_public = _ed25519()
    host, host_public = _ed25519()
    return {
        SSH_PRIVATE_KEY: client,
        SSH_AUTHORIZED_KEYS: f"restrict {client_public} llm-operator\n",
        SSH_HOST_KEY: host,
        SSH_KNOWN_HOSTS: f"{SSH_HOST_ALIAS} {host_public}\n",
    }


def ssh_secret(ld: LLMDeployment) -> dict[str, Any]:
    name = names.ssh_secret(ld.name, ld.metadata.get("uid", ""))
    return secret_of(ld, name, "ssh-identity", key_pair())


class SshIdentities(OwnedSecret):
    """Each multi-node deployment's Secret, made once (controller/secrets/owned_secret.py); a Secret under
    its name that the operator did not create is refused with SshSecretNotOwned."""

    def __init__(self, kube: KubeApi) -> None:
        super().__init__(
            kube,
            ssh_secret,
            "sshSecret",
            lambda name: PlanningError("SshSecretNotOwned", foreign_secret_message(name)),
        )


def foreign_secret_message(name: str) -> str:
    return (
        f'Secret "{name}" exists but this LLMDeployment did not create it, so its multi-node pods '
        "are not started with it: delete that Secret and the operator creates its own key pairs."
    )
