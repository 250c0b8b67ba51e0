"""The launch identity of a deployment's multi-node groups: one Secret per LLMDeployment.

The leader's mpirun starts its workers' daemons through their launch agents over mutual TLS
(runtime/launch_agent.py): two self-signed certificates, the leader's and the workers', each side
trusting exactly the other's. Pods mount only their role's half (render/pod.py). Made once, owned
by the LLMDeployment (the garbage collector removes it with it) and never read back, logged or
rendered: `llm-operator render` shows only the volume that mounts it. Its name carries the
deployment's UID, so a deployment deleted and created again under the same name never meets the
Secret of its predecessor that the garbage collector has yet to remove.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from llm_operator.api.v1alpha1 import LLMDeployment
from llm_operator.contract import LEADER_CERT, LEADER_KEY, WORKER_CERT, WORKER_KEY
from llm_operator.controller.cluster.kube import KubeApi
from llm_operator.controller.secrets.certificates import certificate, common_name, key_pem, pem
from llm_operator.controller.secrets.owned_secret import OwnedSecret, secret_of
from llm_operator.plan.types import Plan, PlanningError
from llm_operator.render import names


def needs_launch_identity(plan: Plan) -> bool:
    return any(p.pods_per_replica > 1 for p in plan.pools)


def _self_signed(name: str, usage: x509.ObjectIdentifier, now: datetime) -> tuple[str, str]:
    """An ECDSA P-256 certificate signed by its own key (PEM), for one side of the agent's TLS:
    the peer's trust store holds exactly it (its own authority, path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = common_name(name)
    cert = (
        certificate(subject, subject, key.public_key(), key, now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, False, False, False), critical=True
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return pem(cert), key_pem(key)


def identities(now: datetime) -> dict[str, str]:
    """The Secret's stringData: the leader's certificate and key (a TLS client) and the workers'
    (a TLS server, one for every worker of the deployment, whatever name the leader reaches it by)."""
    leader_cert, leader_key = _self_signed("llm-operator group leader", ExtendedKeyUsageOID.CLIENT_AUTH, now)
    worker_cert, worker_key = _self_signed("llm-operator group worker", ExtendedKeyUsageOID.SERVER_AUTH, now)
    return {
        LEADER_CERT: leader_cert,
        LEADER_KEY: leader_key,
        WORKER_CERT: worker_cert,
        WORKER_KEY: worker_key,
    }


def launch_secret(ld: LLMDeployment) -> dict[str, Any]:
    name = names.launch_secret(ld.name, ld.metadata.get("uid", ""))
    return secret_of(ld, name, "launch-identity", identities(datetime.now(UTC)))


class LaunchIdentities(OwnedSecret):
    """Each multi-node deployment's Secret, made once (controller/secrets/owned_secret.py); a Secret under
    its name that the operator did not create is refused with LaunchSecretNotOwned."""

    def __init__(self, kube: KubeApi) -> None:
        super().__init__(
            kube,
            launch_secret,
            "launchSecret",
            lambda name: PlanningError("LaunchSecretNotOwned", foreign_secret_message(name)),
        )


def foreign_secret_message(name: str) -> str:
    return (
        f'Secret "{name}" exists but this LLMDeployment did not create it, so its multi-node pods '
        "are not started with it: delete that Secret and the operator creates its own identities."
    )
