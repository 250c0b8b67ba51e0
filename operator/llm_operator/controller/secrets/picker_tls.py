"""The endpoint picker's TLS identity (routing.mode inference-pool): one Secret per LLMDeployment.

The picker serves ext_proc over TLS; its default is a self-signed certificate made at start, which
nobody can verify. Instead the operator makes a certificate authority and a serving certificate
signed by it, once (controller/secrets/owned_secret.py), and throws the authority's key away, so no other
certificate can ever be signed by it. The Secret (kubernetes.io/tls) holds tls.crt, tls.key and
ca.crt: the picker serves tls.crt (`--cert-path`, reloaded on change), the router's Envoy verifies
it against ca.crt and the name `localhost` (it asks the picker on 127.0.0.1), and a gateway that
routes to the InferencePool can verify the router Service's name with the same ca.crt. Like the
other owned Secrets it is never read back, logged or rendered; its name carries the UID.
"""

from __future__ import annotations

import ipaddress
from datetime import UTC, datetime
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from llm_operator.api.v1alpha1 import LLMDeployment
from llm_operator.controller.cluster.kube import KubeApi
from llm_operator.controller.secrets.certificates import certificate, common_name, key_pem, pem
from llm_operator.controller.secrets.owned_secret import OwnedSecret, secret_of
from llm_operator.plan.types import PlanningError
from llm_operator.render import names
from llm_operator.render.router.envoy import PICKER_SERVER_NAME

REASON = "PickerTlsSecretNotOwned"


def picker_certificates(service: str, namespace: str, now: datetime) -> dict[str, str]:
    """tls.crt, tls.key and ca.crt (PEM): a serving certificate for the picker, valid for
    `localhost` and 127.0.0.1 (Envoy beside it) and the router Service's names (gateways), signed
    by an authority whose key is not kept."""
    authority_key = ec.generate_private_key(ec.SECP256R1())
    # A common name holds at most 64 characters, a namespace and a Service name 63 each: the names
    # go into the serving certificate's SANs, the subjects stay fixed.
    authority = common_name("llm-operator endpoint picker CA")
    ca = (
        certificate(authority, authority, authority_key.public_key(), authority_key, now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(authority_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    dns = [PICKER_SERVER_NAME, service, f"{service}.{namespace}", f"{service}.{namespace}.svc",
           f"{service}.{namespace}.svc.cluster.local"]  # fmt: skip
    sans = [x509.DNSName(n) for n in dns] + [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    serving = (
        certificate(
            common_name("llm-operator endpoint picker"), authority, key.public_key(), authority_key, now
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(authority_key, hashes.SHA256())
    )
    return {"tls.crt": pem(serving), "tls.key": key_pem(key), "ca.crt": pem(ca)}


def picker_tls_secret(ld: LLMDeployment) -> dict[str, Any]:
    name = names.picker_tls_secret(ld.name, ld.metadata.get("uid", ""))
    files = picker_certificates(names.router(ld.name), ld.namespace, datetime.now(UTC))
    return secret_of(ld, name, "picker-tls", files, "kubernetes.io/tls")


def foreign_secret_message(name: str) -> str:
    return (
        f'Secret "{name}" exists but this LLMDeployment did not create it, so its router does not '
        "trust it: delete that Secret and the operator creates its own."
    )


class PickerTls(OwnedSecret):
    """Every inference-pool deployment's picker certificate, made before its router needs it."""

    def __init__(self, kube: KubeApi) -> None:
        super().__init__(
            kube,
            picker_tls_secret,
            "pickerTlsSecret",
            lambda name: PlanningError(REASON, foreign_secret_message(name)),
        )
