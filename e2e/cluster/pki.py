"""Certificates and keys for the embedded control plane, generated fresh on every `up`.

ECDSA P-256 keeps generation fast (milliseconds); the service-account signing key is RSA because
that is what every token consumer expects by default.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Every name the apiserver is reached by: loopback for the host (through the forwarder), the
# in-cluster service names, the first address of the service range for pods
# (kubernetes.default.svc == 10.96.0.1) and the node address it listens on inside the namespace.
APISERVER_DNS_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
APISERVER_IPS = ("127.0.0.1", "10.96.0.1", "10.240.0.10")
# The real node (kubelet --hostname-override): its client cert names it.
NODE_NAME = "real-0"
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
VALIDITY = dt.timedelta(days=30)

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    """Paths of everything the components and the launcher read (all under <state>/pki)."""

    ca: KeyPair
    apiserver: KeyPair
    front_proxy_ca: KeyPair
    front_proxy_client: KeyPair
    sa_key: Path
    sa_pub: Path
    # Client identities: name -> cert/key used in that component's kubeconfig.
    clients: dict[str, KeyPair]


# CN / O of each client identity. kube-controller-manager runs with
# --use-service-account-credentials=false, so all its controllers (GC, HPA, ...) act as itself and need
# more than the system:kube-controller-manager role grants: hence system:masters. The scheduler's
# default RBAC role is enough. kwok writes node/pod status and deletes pods anywhere. The kubelet is
# a node (Node authorizer), kube-proxy is bound by the default system:node-proxier binding, CoreDNS
# gets its read-only role from the launcher, and the apiserver's kubelet client may do anything on
# the kubelet API (logs, exec, port-forward), as kubeadm's does.
CLIENTS: dict[str, tuple[str, str | None]] = {
    "admin": ("kubernetes-admin", "system:masters"),
    "kube-controller-manager": ("system:kube-controller-manager", "system:masters"),
    "kube-scheduler": ("system:kube-scheduler", None),
    "kwok": ("kwok-controller", "system:masters"),
    "kubelet": (f"system:node:{NODE_NAME}", "system:nodes"),
    "kube-proxy": ("system:kube-proxy", None),
    "coredns": ("system:coredns", None),
    "apiserver-kubelet-client": ("kube-apiserver-kubelet-client", "system:masters"),
    # The monitoring stack (monitoring.py binds their least-privilege roles).
    "prometheus": ("e2e:prometheus", None),
    "prometheus-adapter": ("e2e:prometheus-adapter", None),
    # The Gateway API implementation (gateway.py binds its role).
    "gateway": ("e2e:traefik", None),
    # The NetworkPolicy enforcer (enforcer.py binds its read-only role).
    "kube-router": ("e2e:kube-router", None),
}


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def write_private(path: Path, data: str | bytes) -> None:
    """Write a file only its owner can read, from its first byte (a chmod after the write leaves
    a moment at the umask's mode), also over an existing file of a wider mode."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(fd, 0o600)
        f.write(data.encode() if isinstance(data, str) else data)


def _write_key(path: Path, key: PrivateKey) -> None:
    write_private(
        path,
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


class _Issuer:
    def __init__(self, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        self.cert = cert
        self.key = key

    def sign(
        self,
        subject: x509.Name,
        key: ec.EllipticCurvePrivateKey,
        usages: list[x509.ObjectIdentifier],
        sans: list[x509.GeneralName] | None = None,
    ) -> x509.Certificate:
        now = dt.datetime.now(dt.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return builder.sign(self.key, hashes.SHA256())


def _new_ca(cn: str) -> _Issuer:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _Issuer(cert, key)


def _pair(directory: Path, name: str) -> KeyPair:
    return KeyPair(directory / f"{name}.crt", directory / f"{name}.key")


def paths(directory: Path) -> Pki:
    """The paths of the PKI `generate` wrote into `directory`."""
    return Pki(
        ca=_pair(directory, "ca"),
        apiserver=_pair(directory, "apiserver"),
        front_proxy_ca=_pair(directory, "front-proxy-ca"),
        front_proxy_client=_pair(directory, "front-proxy-client"),
        sa_key=directory / "sa.key",
        sa_pub=directory / "sa.pub",
        clients={name: _pair(directory, f"client-{name}") for name in CLIENTS},
    )


def _save(directory: Path, name: str, cert: x509.Certificate, key: PrivateKey) -> KeyPair:
    pair = _pair(directory, name)
    _write_cert(pair.cert, cert)
    _write_key(pair.key, key)
    return pair


def generate(directory: Path) -> Pki:
    """Write a complete, fresh PKI into `directory` and return the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = _new_ca("llm-operator-e2e-ca")
    front_proxy_ca = _new_ca("llm-operator-e2e-front-proxy-ca")

    server_key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in APISERVER_DNS_NAMES]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in APISERVER_IPS]
    server_cert = ca.sign(_name("kube-apiserver"), server_key, [ExtendedKeyUsageOID.SERVER_AUTH], sans)

    # The aggregator presents this client cert to aggregated API servers (custom metrics); they
    # trust it through --requestheader-client-ca-file, which the apiserver publishes in kube-system.
    proxy_key = ec.generate_private_key(ec.SECP256R1())
    proxy_cert = front_proxy_ca.sign(
        _name("front-proxy-client"), proxy_key, [ExtendedKeyUsageOID.CLIENT_AUTH]
    )

    clients = {}
    for name, (cn, org) in CLIENTS.items():
        key = ec.generate_private_key(ec.SECP256R1())
        cert = ca.sign(_name(cn, org), key, [ExtendedKeyUsageOID.CLIENT_AUTH])
        clients[name] = _save(directory, f"client-{name}", cert, key)

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sa_key_path, sa_pub_path = directory / "sa.key", directory / "sa.pub"
    _write_key(sa_key_path, sa_key)
    sa_pub_path.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return Pki(
        ca=_save(directory, "ca", ca.cert, ca.key),
        apiserver=_save(directory, "apiserver", server_cert, server_key),
        front_proxy_ca=_save(directory, "front-proxy-ca", front_proxy_ca.cert, front_proxy_ca.key),
        front_proxy_client=_save(directory, "front-proxy-client", proxy_cert, proxy_key),
        sa_key=sa_key_path,
        sa_pub=sa_pub_path,
        clients=clients,
    )


def issue_server_cert(directory: Path, name: str, dns_names: list[str], ips: Sequence[str] = ()) -> KeyPair:
    """A serving cert for `dns_names` (and `ips`), signed by the cluster CA `generate` wrote into
    `directory` (an aggregated API server's: the aggregator checks it against the APIService's
    caBundle; the registry's, which containerd, crane and helm check against the CA)."""
    ca = paths(directory).ca
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    issuer = _Issuer(x509.load_pem_x509_certificate(ca.cert.read_bytes()), ca_key)
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    cert = issuer.sign(_name(dns_names[0]), key, [ExtendedKeyUsageOID.SERVER_AUTH], sans)
    return _save(directory, name, cert, key)
