"""The NetworkPolicy of an LLMDeployment on the real API server and a real serving pod, enforced by
the test world's enforcer (kube-router's network policy controller, e2e/cluster/enforcer.py).

What this proves: the API server accepts the policy the operator renders, with the operator's
metrics peers as the e2e world configures them; its podSelector selects the live serving pod; under
it a client pod in another namespace reaches neither Triton's client port 8000 nor its metrics port
8002, while Prometheus (the metrics peer, a process on the node address) still scrapes 8002;
switching `spec.networkPolicy.enabled` off deletes the policy without restarting the pod and opens
8002 to the client; a clientNamespaceSelector that selects the client's namespace opens it 8000
(not 8002); a policy an earlier operator applied open to any source stays open through an upgrade,
until the spec names its clients. Sources on the node itself are admitted whatever the policy says
(kube-router admits a pod's own node, as kubelet probes need): Prometheus's scrape shows that the
policy does not cut the monitoring path, not that the ipBlock rule is what admits it.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from llm_operator.contract import OPENAI_PORT

from e2e.chat import base_url
from e2e.cluster import busybox_image, netns
from e2e.cluster.netns import NODE_IP
from e2e.cluster.pki import NODE_NAME
from e2e.cluster.testing import E2ECluster, Kubectl, WaitTimeout, is_true, pod_ready, wait_for
from e2e.generate import connection, stream

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAME = "tiny-llama"
SELECTOR = f"llmoperator.io/deployment={NAME}"
CLIENT_IMAGE = "localhost/llm-operator/busybox:e2e"
PROBE_TIMEOUT_S = 3  # nc gives up then on a dropped SYN; an open port answers in milliseconds
# kube-router applies a policy change within a second or two of the watch event.
ENFORCED_WITHIN_S = 30
KEPT = "llmoperator.io/clients-from-any-source"  # render/network.py KEPT_ANY_SOURCE


def tiny_llama(
    enabled: bool, client_namespaces: dict[str, Any] | None = None, api_keys: str | None = None
) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / "cpu-reference.yaml").read_text())
    doc["spec"]["resources"]["cpu"] = "250m"
    doc["spec"]["networkPolicy"] = {"enabled": enabled}
    if client_namespaces is not None:
        doc["spec"]["networkPolicy"]["clientNamespaceSelector"] = client_namespaces
    if api_keys is not None:
        doc["spec"]["routing"] = {"apiKeys": {"secretRef": {"name": api_keys}}}
    return doc


def client_pod() -> dict[str, Any]:
    """busybox on the real node that only waits: the tests run wget in it (restricted-compliant)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "client"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE_NAME},
            "terminationGracePeriodSeconds": 0,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65534,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "client",
                    "image": CLIENT_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }


@dataclass
class World:
    namespace: str  # the LLMDeployment's
    client: str  # the client pod's namespace
    netns: str
    prometheus_url: str


def selected(kubectl: Kubectl, ns: str, policy: dict[str, Any]) -> set[str]:
    labels = ",".join(f"{k}={v}" for k, v in policy["spec"]["podSelector"]["matchLabels"].items())
    return {p["metadata"]["name"] for p in kubectl.items("pods", ns, labels)}


def answer(kubectl: Kubectl, world: World, ip: str, port: int, path: str, key: str | None = None) -> int:
    """The HTTP status the client pod gets from ip:port within PROBE_TIMEOUT_S, 0 for none. (nc:
    busybox's `wget -T` crashes in the static build. nc half-closes once the request is sent: the
    front door answers such a client; it once cancelled the request, which failed this test.)"""
    auth = f"Authorization: Bearer {key}\\r\\n" if key else ""
    request = f"printf 'GET {path} HTTP/1.0\\r\\n{auth}\\r\\n' | nc -w {PROBE_TIMEOUT_S} {ip} {port}"
    out = kubectl("exec", "-n", world.client, "client", "--", "sh", "-c", request, check=False).stdout.split()
    return int(out[1]) if len(out) > 1 and out[0].startswith("HTTP/1.") and out[1].isdigit() else 0


def reaches(kubectl: Kubectl, world: World, ip: str, port: int, path: str) -> bool:
    """Whether the client pod gets HTTP 200 from ip:port within PROBE_TIMEOUT_S."""
    return answer(kubectl, world, ip, port, path) == 200


def ports_reached(kubectl: Kubectl, world: World, ip: str) -> tuple[bool, bool]:
    """(client port 8000, metrics port 8002) answered 200 to the client pod."""
    return reaches(kubectl, world, ip, 8000, "/v2/health/ready"), reaches(
        kubectl, world, ip, 8002, "/metrics"
    )


def scraped_since(world: World, ip: str, since: float) -> bool:
    """Whether Prometheus's last scrape of ip:8002 succeeded and is newer than `since` (epoch s)."""
    with urllib.request.urlopen(f"{world.prometheus_url}/api/v1/targets", timeout=5) as r:
        targets = json.loads(r.read())["data"]["activeTargets"]
    for t in targets:
        if t["labels"].get("instance") == f"{ip}:8002":
            # RFC 3339 with nanoseconds, which fromisoformat does not take: whole seconds are enough.
            m = re.fullmatch(r"(.{19})(?:\.\d+)?(.*)", t["lastScrape"])
            assert m is not None, t["lastScrape"]
            stamp = datetime.fromisoformat(m[1] + m[2].replace("Z", "+00:00")).timestamp()
            return bool(t["health"] == "up" and stamp > since)
    return False


@pytest.fixture(scope="module")
def world(
    operator: None, cluster: E2ECluster, kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    if cluster.launcher is None:
        pytest.skip("needs the embedded cluster: its real node runs the serving pod and the enforcer")
    archive = busybox_image.write(
        tmp_path_factory.mktemp("img") / "busybox.oci.tar", CLIENT_IMAGE, ["/bin/sh"]
    )
    cluster.launcher.import_image(archive)
    ns = kubectl.create_namespace("netpol")
    client = kubectl.create_namespace("netpol-client")
    try:
        kubectl.apply(client_pod(), namespace=client)
        yield World(ns, client, cluster.launcher.netns, cluster.launcher.prometheus_url)
    finally:
        kubectl.delete("namespace", ns)
        kubectl.delete("namespace", client)


def test_the_policy_is_enforced_on_the_live_pod_and_goes_when_switched_off(
    world: World, kubectl: Kubectl
) -> None:
    ns = world.namespace
    kubectl.apply(tiny_llama(enabled=True), namespace=ns)
    wait_for(
        f"{NAME} Ready",
        lambda: kubectl.get("llmdeployment", NAME, ns),
        lambda d: d is not None and is_true(d, "Ready"),
        timeout=240,
    )
    wait_for(
        "the client pod Ready", lambda: kubectl.get("pod", "client", world.client), pod_ready, timeout=60
    )
    policy = kubectl.get("networkpolicy", NAME, ns)
    assert policy is not None, "the operator applies the policy by default"
    (pod,) = kubectl.items("pods", ns, SELECTOR)
    ip = pod["status"]["podIP"]
    assert selected(kubectl, ns, policy) == {pod["metadata"]["name"]}
    rules = policy["spec"]["ingress"]
    metrics = {"from": [{"ipBlock": {"cidr": f"{NODE_IP}/32"}}], "ports": [{"port": 8002, "protocol": "TCP"}]}
    assert metrics in rules, "the e2e world's Prometheus: a process on the node address"

    # Enforced: neither the client port nor the metrics port is open to a pod of another namespace.
    wait_for(
        "8000 and 8002 closed to a pod of another namespace",
        lambda: ports_reached(kubectl, world, ip),
        lambda found: found == (False, False),
        timeout=ENFORCED_WITHIN_S,
    )
    # ...while Prometheus scrapes it, and the Service (kube-proxy) serves from the cluster's network.
    since = time.time()
    wait_for(
        "a successful scrape of 8002 under the policy", lambda: scraped_since(world, ip, since), timeout=30
    )
    service = kubectl.get("service", NAME, ns)
    assert service is not None
    chunks = list(
        stream(connection(service["spec"]["clusterIP"], OPENAI_PORT, inside=world.netns), NAME, "Once", 8)
    )
    assert len(chunks) == 8

    sts = kubectl.get("statefulset", NAME, ns)
    assert sts is not None
    kubectl.apply(tiny_llama(enabled=False), namespace=ns)
    wait_for(
        "the NetworkPolicy deleted",
        lambda: kubectl.get("networkpolicy", NAME, ns),
        lambda p: p is None,
        timeout=60,
    )
    # The pass that pruned it applied the workloads first: a new revision would show by now.
    after = kubectl.get("statefulset", NAME, ns)
    assert after is not None
    assert after["metadata"]["generation"] == sts["metadata"]["generation"], "the pods are not rolled"
    (still,) = kubectl.items("pods", ns, SELECTOR)
    assert still["metadata"]["uid"] == pod["metadata"]["uid"]
    wait_for(
        "8002 open to the client pod without a policy",
        lambda: reaches(kubectl, world, ip, 8002, "/metrics"),
        timeout=ENFORCED_WITHIN_S,
    )

    # Client ports from the namespaces selected: the client's is.
    clients = {"matchLabels": {"kubernetes.io/metadata.name": world.client}}
    kubectl.apply(tiny_llama(enabled=True, client_namespaces=clients), namespace=ns)
    wait_for(
        "8000 open to the namespace selected, 8002 closed",
        lambda: ports_reached(kubectl, world, ip),
        lambda found: found == (True, False),
        timeout=60 + ENFORCED_WITHIN_S,
    )


def test_an_upgrade_keeps_a_policy_open_to_any_source_until_the_spec_names_clients(
    world: World, kubectl: Kubectl
) -> None:
    """Operators before clients were limited applied the client rule without `from`. Given such a
    policy (made here by removing `from` as that operator's apply would have left it), the operator
    keeps it, marked, so no client of a running deployment is cut off by the upgrade; naming the
    clients ends it."""
    ns = world.namespace
    kubectl.apply(tiny_llama(enabled=True), namespace=ns)
    wait_for(f"{NAME} Ready", lambda: kubectl.get("llmdeployment", NAME, ns),
             lambda d: d is not None and is_true(d, "Ready"), timeout=240)  # fmt: skip
    (pod,) = kubectl.items("pods", ns, SELECTOR)
    ip = pod["status"]["podIP"]
    policy = kubectl.get("networkpolicy", NAME, ns)
    assert policy is not None
    _, *others = policy["spec"]["ingress"]
    kubectl("patch", "networkpolicy", NAME, "-n", ns, "--type=json", "-p",
            json.dumps([{"op": "remove", "path": "/spec/ingress/0/from"}]))  # fmt: skip
    # The operator sees the change (its child watch) and applies again: the mark is its apply's.
    kept = wait_for(
        "the policy applied again, kept open and marked",
        lambda: kubectl.get("networkpolicy", NAME, ns),
        lambda p: p is not None and KEPT in (p["metadata"].get("annotations") or {}),
        timeout=60,
    )
    assert kept is not None and "from" not in kept["spec"]["ingress"][0], "not narrowed by the operator"
    assert kept["spec"]["ingress"][1:] == others
    wait_for(
        "8000 open to a pod of another namespace, as before the upgrade",
        lambda: reaches(kubectl, world, ip, 8000, "/v2/health/ready"),
        timeout=ENFORCED_WITHIN_S,
    )

    kubectl.apply(tiny_llama(enabled=True, client_namespaces={"matchLabels": {"serving-clients": "yes"}}),
                  namespace=ns)  # fmt: skip
    wait_for("8000 closed once the spec names its clients",
             lambda: reaches(kubectl, world, ip, 8000, "/v2/health/ready"), lambda ok: not ok,
             timeout=60 + ENFORCED_WITHIN_S)  # fmt: skip
    narrowed = kubectl.get("networkpolicy", NAME, ns)
    assert narrowed is not None and "from" in narrowed["spec"]["ingress"][0]
    assert KEPT not in (narrowed["metadata"].get("annotations") or {})


def test_api_keys_guard_the_openai_port_close_tritons_and_rotate_without_a_restart(
    world: World, cluster: E2ECluster, kubectl: Kubectl
) -> None:
    """spec.routing.apiKeys on the same live deployment: the policy now admits the client pod's
    namespace (selected) to the OpenAI port only (Triton's own APIs check no key); there a request
    without an accepted key is 401 in OpenAI's format and the openai SDK with the key is answered.
    A rotated Secret (new key in, old key out) reaches the front door through the kubelet's update
    of the volume with no restart: a pod update makes the kubelet sync the volume at once instead
    of at its next periodic sync (up to a minute)."""
    ns, first, second = world.namespace, "sk-e2e-" + secrets.token_hex(8), "sk-e2e-" + secrets.token_hex(8)
    kubectl.apply(api_key_secret({"first": first}), namespace=ns)
    clients = {"matchLabels": {"kubernetes.io/metadata.name": world.client}}
    kubectl.apply(tiny_llama(enabled=True, client_namespaces=clients, api_keys="llm-api-keys"), namespace=ns)

    def keyed_and_ready(d: dict[str, Any] | None) -> bool:
        pods = kubectl.items("pods", ns, SELECTOR)
        current = d is not None and d["status"]["observedGeneration"] == d["metadata"]["generation"]
        keyed = all("LLMOP_API_KEYS_DIR" in json.dumps(p["spec"]) and pod_ready(p) for p in pods)
        return current and is_true(d, "Ready") and len(pods) == 1 and keyed

    ld = wait_for(
        f"{NAME} Ready with API keys",
        lambda: kubectl.get("llmdeployment", NAME, ns),
        keyed_and_ready,
        timeout=240,
    )
    (pod,) = kubectl.items("pods", ns, SELECTOR)
    ip = pod["status"]["podIP"]
    try:
        wait_for(
            "the client's namespace admitted to 8080 (/health asks no key), 8000 closed under API keys",
            lambda: (answer(kubectl, world, ip, 8080, "/health"), ports_reached(kubectl, world, ip)[0]),
            lambda found: found == (200, False),
            timeout=ENFORCED_WITHIN_S,
        )
    except WaitTimeout as e:
        raise WaitTimeout(f"{e}\n{enforcement(kubectl, world, cluster, ns, pod)}") from None
    assert answer(kubectl, world, ip, 8080, "/v1/models") == 401
    assert answer(kubectl, world, ip, 8080, "/v1/models", key="sk-wrong") == 401
    assert answer(kubectl, world, ip, 8080, "/v1/models", key=first) == 200

    assert cluster.launcher is not None and ld is not None
    with base_url(cluster.launcher, ld["status"]["endpoints"]["openai"]) as base:
        sdk = openai.OpenAI(base_url=base, api_key=first, max_retries=0, timeout=60)
        done = sdk.completions.create(model="tiny-llama", prompt="Once", max_tokens=4, temperature=0)
        assert done.choices[0].text
        with pytest.raises(openai.AuthenticationError) as refused:
            openai.OpenAI(base_url=base, api_key=second, max_retries=0).models.list()
        assert refused.value.response.json()["error"]["code"] == "invalid_api_key"

    kubectl.apply(api_key_secret({"second": second}), namespace=ns)
    kubectl("annotate", "pod", pod["metadata"]["name"], f"e2e/rotated={int(time.time())}", "--overwrite",
            namespace=ns)  # fmt: skip
    wait_for(
        "the rotated key accepted",
        lambda: answer(kubectl, world, ip, 8080, "/v1/models", key=second),
        lambda status: status == 200,
        timeout=60,
    )
    assert answer(kubectl, world, ip, 8080, "/v1/models", key=first) == 401, "the removed key is refused"
    (still,) = kubectl.items("pods", ns, SELECTOR)
    assert (
        still["metadata"]["uid"] == pod["metadata"]["uid"]
        and still["status"]["containerStatuses"][0]["restartCount"]
        == pod["status"]["containerStatuses"][0]["restartCount"]
    ), "rotated without a restart"
    log = kubectl("logs", pod["metadata"]["name"], "-c", "triton", namespace=ns).stdout
    assert "API key(s) accepted" in log and first not in log and second not in log, "keys never logged"


def enforcement(kubectl: Kubectl, world: World, cluster: E2ECluster, ns: str, pod: dict[str, Any]) -> str:
    """What decides whether a port is reached: the probe's own words, the policy as applied, what
    the front door said, every pod that holds either address, the enforcer's rules for the pod's
    address and its last syncs."""
    ip = pod["status"]["podIP"]
    probe = kubectl("exec", "-n", world.client, "client", "--", "sh", "-c",
                    f"printf 'GET /health HTTP/1.0\\r\\n\\r\\n' | nc -w {PROBE_TIMEOUT_S} {ip} 8080",
                    check=False)  # fmt: skip
    client = kubectl.get("pod", "client", world.client) or {}
    addresses = {ip, (client.get("status") or {}).get("podIP")}
    every_pod = kubectl.json("get", "pods", "--all-namespaces")["items"]
    holders = [f"{p['metadata']['namespace']}/{p['metadata']['name']} {p['status'].get('podIP')} "
               f"{p['status'].get('phase')} deleting={bool(p['metadata'].get('deletionTimestamp'))}"
               for p in every_pod if (p.get("status") or {}).get("podIP") in addresses]  # fmt: skip
    policy = kubectl.get("networkpolicy", NAME, ns)
    log = kubectl("logs", pod["metadata"]["name"], "-c", "triton", namespace=ns, check=False).stdout
    door = [line for line in log.splitlines() if "frontdoor" in line]
    rules = subprocess.run(netns.command(world.netns, ["iptables-save", "-t", "filter"]),
                           capture_output=True, text=True, check=False).stdout  # fmt: skip
    assert cluster.launcher is not None
    syncs = cluster.launcher.log_file("kube-router").read_text().splitlines()[-10:]
    return "\n".join([f"probe: rc {probe.returncode}, out {probe.stdout!r}, err {probe.stderr!r}",
                      f"pods holding {addresses}: {holders}",
                      f"policy ingress: {json.dumps((policy or {}).get('spec', {}).get('ingress'))}",
                      f"front door: {door}", "rules naming the pod:",
                      *[line for line in rules.splitlines() if ip in line],
                      "kube-router:", *syncs])  # fmt: skip


def api_key_secret(keys: dict[str, str]) -> dict[str, Any]:
    """`data`, not `stringData`: server-side apply then removes a key the next apply leaves out
    (stringData is write-only, so no field manager would own, and remove, the key it wrote)."""
    data = {name: base64.b64encode(key.encode()).decode() for name, key in keys.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "llm-api-keys"}, "data": data,
            "type": "Opaque"}  # fmt: skip
