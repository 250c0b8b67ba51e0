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
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from llm_operator.api.v1alpha1 import LLMDeployment
from llm_operator.controller.cluster.kube import KubeApi
from llm_operator.controller.secrets.owned_secret import OwnedSecret, secret_of
from llm_operator.plan.types import PlanningError
from llm_operator.render import names
from llm_operator.render.router.envoy import PICKER_SERVER_NAME

REASON = "PickerTlsSecretNotOwned"
VALID_DAYS = 3650  # replaced by deleting the Secret (docs/routing.md), not by expiry
SKEW = timedelta(minutes=5)  # nodes whose clocks run a little behind accept it at once


def common_name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def certificate(
    subject: x509.Name, issuer: x509.Name, public: Any, signer: ec.EllipticCurvePrivateKey, now: datetime
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - SKEW)
        .not_valid_after(now + timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), critical=False
        )
    )


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
    pem = serialization.Encoding.PEM
    return {
        "tls.crt": serving.public_bytes(pem).decode(),
        "tls.key": key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode(),
        "ca.crt": ca.public_bytes(pem).decode(),
    }


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
