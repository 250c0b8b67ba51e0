"""The endpoint picker's certificate (controller/secrets/picker_tls.py): what it is valid for, that nothing
else can be signed by its authority, and how the reconciler makes it once, mounts it and refuses a
Secret it did not make. tests/unit/test_router_envoy.py has the real Envoy verify it (and refuse
another authority's); the routing e2e tests serve through it on the real node."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError
from llm_operator.controller.secrets.picker_tls import REASON, picker_certificates

from tests.unit.test_reconciler import condition, example, operator_with_nodes, reconcile

NOW = datetime(2026, 11, 28, tzinfo=UTC)


def _verify(files: dict[str, str], name: x509.GeneralName, when: datetime = NOW) -> None:
    ca = x509.load_pem_x509_certificate(files["ca.crt"].encode())
    leaf = x509.load_pem_x509_certificate(files["tls.crt"].encode())
    builder = PolicyBuilder().store(Store([ca])).time(when)
    if isinstance(name, x509.DNSName):
        builder.build_server_verifier(name).verify(leaf, [])
    else:
        builder.build_server_verifier(x509.IPAddress(name.value)).verify(leaf, [])


def test_the_certificate_serves_envoys_name_and_the_router_services_names() -> None:
    files = picker_certificates("tiny-router", "team", NOW)
    for name in ("localhost", "tiny-router.team.svc", "tiny-router.team.svc.cluster.local"):
        _verify(files, x509.DNSName(name))
    with pytest.raises(VerificationError):
        _verify(files, x509.DNSName("other-router.team.svc"))
    with pytest.raises(VerificationError):
        _verify(files, x509.DNSName("localhost"), NOW + timedelta(days=3651))
    other = picker_certificates("tiny-router", "team", NOW)
    with pytest.raises(VerificationError):  # another deployment's authority does not vouch for it
        _verify({**files, "ca.crt": other["ca.crt"]}, x509.DNSName("localhost"))


def test_the_longest_names_kubernetes_allows_fit() -> None:
    """A namespace and a Service name of 63 characters each (a common name holds at most 64)."""
    service, namespace = "r" * 56 + "-router", "n" * 63
    files = picker_certificates(service, namespace, NOW)
    _verify(files, x509.DNSName(f"{service}.{namespace}.svc.cluster.local"))
    _verify(files, x509.DNSName("localhost"))


def test_only_the_serving_key_is_kept() -> None:
    files = picker_certificates("tiny-router", "team", NOW)
    assert set(files) == {"tls.crt", "tls.key", "ca.crt"}
    assert sum("PRIVATE KEY" in text for text in files.values()) == 1, "the authority's key is not kept"
    ca = x509.load_pem_x509_certificate(files["ca.crt"].encode())
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert constraints.ca and constraints.path_length == 0


def routed() -> dict[str, Any]:
    doc = example("cpu-reference")
    doc["spec"]["routing"] = {"mode": "inference-pool"}
    return doc


async def test_the_reconciler_makes_it_once_and_the_router_mounts_its_parts() -> None:
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(routed())
    await reconcile(kube, reconciler, key)
    uid = kube.objects[("LLMDeployment", *key)]["metadata"]["uid"]
    name = f"tiny-llama-pickertls-{uid[:8]}"
    secret = kube.objects[("Secret", key[0], name)]
    assert secret["type"] == "kubernetes.io/tls"
    assert kube.objects[("LLMDeployment", *key)]["status"]["pickerTlsSecret"] == name
    (router,) = kube.of_kind("Deployment").values()
    pod = router["spec"]["template"]["spec"]
    mounted = {v["name"]: v["secret"] for v in pod["volumes"] if "secret" in v}
    assert {v["secretName"] for v in mounted.values()} == {name}
    parts = {c["name"]: {m["name"] for m in c["volumeMounts"]} for c in pod["containers"]}
    keys = {n: [i["key"] for i in v["items"]] for n, v in mounted.items()}
    assert [keys[m] for m in sorted(parts["epp"] & set(keys))] == [["tls.crt", "tls.key"]]
    assert [keys[m] for m in sorted(parts["envoy"] & set(keys))] == [["ca.crt"]], "no key in Envoy"
    assert secret["stringData"]["tls.key"] not in yaml.safe_dump(router)

    kube.take_writes()
    await reconcile(kube, reconciler, key)
    assert not [w for w in kube.take_writes() if w[1] == "Secret" and w[2] == name], "made once"


async def test_a_picker_secret_the_operator_did_not_create_is_never_mounted() -> None:
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(routed())
    uid = kube.objects[("LLMDeployment", *key)]["metadata"]["uid"]
    name = f"tiny-llama-pickertls-{uid[:8]}"
    kube.objects[("Secret", key[0], name)] = {
        "kind": "Secret",
        "metadata": {"name": name, "namespace": key[0]},
    }
    await reconcile(kube, reconciler, key)
    assert condition(kube, "tiny-llama", "Stalled")["reason"] == REASON
    assert not kube.of_kind("Deployment"), "no router trusts it"
