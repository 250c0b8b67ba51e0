"""The deployment's NetworkPolicy (render/network.py): what it admits, read the way NetworkPolicy
is defined (a connection is allowed when one ingress rule of a policy selecting the pod matches
both its source and its port), over the pods the operator actually renders, canary slots and
multi-node groups included. tests/e2e/test_network_policy.py proves a single pod's policy enforced
on the real node (kube-router, docs/development.md); these tests pin its meaning for every shape."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import kubernetes_validate
import pytest
from llm_operator import labels as L
from llm_operator.api.v1alpha1 import LLMDeployment
from llm_operator.controller.config import OperatorConfig
from llm_operator.desired import desired, plan_for
from llm_operator.engine.state import BuildFact, BuildObserved
from llm_operator.plan.inventory import Inventory
from llm_operator.render import network
from llm_operator.rollout.revision import Slot, revision_of

from e2e.cluster.nodes import build_nodes, load_pools
from tests.unit.model_cache_fixtures import cached
from tests.unit.test_render_rollout import IMAGES, deployment


@dataclass(frozen=True)
class Source:
    namespace: str | None  # None: not a pod (a process on a node, outside the cluster)
    labels: dict[str, str] = field(default_factory=dict)
    namespace_labels: dict[str, str] = field(default_factory=dict)
    ip: str = "10.1.2.3"


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        present, value = e["key"] in labels, labels.get(e["key"])
        ok = {
            "Exists": present,
            "DoesNotExist": not present,
            "In": value in e.get("values", []),
            "NotIn": value not in e.get("values", []),
        }[e["operator"]]
        if not ok:
            return False
    return True


def _peer_matches(peer: dict[str, Any], source: Source, policy_namespace: str) -> bool:
    import ipaddress

    if "ipBlock" in peer:
        return ipaddress.ip_address(source.ip) in ipaddress.ip_network(peer["ipBlock"]["cidr"])
    if source.namespace is None:
        return False
    if "namespaceSelector" in peer:
        ns_labels = {**source.namespace_labels, network.NAMESPACE_NAME: source.namespace}
        if not _selects(peer["namespaceSelector"], ns_labels):
            return False
    elif source.namespace != policy_namespace:
        return False
    return "podSelector" not in peer or _selects(peer["podSelector"], source.labels)


def admitted(policies: list[dict[str, Any]], pod: dict[str, str], source: Source, port: int) -> bool:
    selecting = [p for p in policies if _selects(p["spec"]["podSelector"], pod)]
    if not selecting:
        return True  # no policy selects the pod: everything is admitted
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            ports = rule.get("ports")
            if ports is not None and not any(p["port"] == port for p in ports):
                continue
            peers = rule.get("from")
            if not peers or any(_peer_matches(p, source, policy["metadata"]["namespace"]) for p in peers):
                return True
    return False


def pod_labels(objs: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The labels of every serving pod the objects' templates make."""
    out = []
    for o in objs:
        if o["kind"] == "StatefulSet":
            out.append(o["spec"]["template"]["metadata"]["labels"])
        elif o["kind"] == "LeaderWorkerSet":
            lwt = o["spec"]["leaderWorkerTemplate"]
            out += [lwt[t]["metadata"]["labels"] for t in ("leaderTemplate", "workerTemplate")]
    return out


Objs = list[dict[str, Any]]


def render(ld: LLMDeployment, slot: Slot = Slot.A, **kw: Any) -> tuple[Objs, list[dict[str, str]]]:
    """(NetworkPolicies, serving pods' labels) of one slot."""
    inventory = Inventory()
    for node in build_nodes(load_pools()):
        inventory.upsert(node)
    want = desired(
        ld,
        plan_for(ld, inventory),
        IMAGES,
        lambda *_: BuildObserved(BuildFact.RECORDED),
        slot=slot,
        models=cached,
        **kw,
    )
    policies = [o for o in want.shared if o["kind"] == "NetworkPolicy"]
    return policies, pod_labels(want.children)


CLIENT = Source("apps", {"app": "chat"})
MONITORING = Source("monitoring", {"app": "prometheus"})
NODE_PROMETHEUS = Source(None, ip="192.0.2.7")


NEIGHBOUR = Source("default", {"app": "chat"})  # a pod of the deployment's own namespace


def test_clients_of_its_namespace_reach_the_serving_ports_and_only_monitoring_the_metrics() -> None:
    ld = deployment("cpu-reference")
    for slot in (Slot.A, Slot.B):  # a canary's pods are covered from their first start
        policies, pods = render(ld, slot)
        assert len(policies) == 1 and pods
        assert network.KEPT_ANY_SOURCE not in (policies[0]["metadata"].get("annotations") or {})
        for pod in pods:
            assert admitted(policies, pod, NEIGHBOUR, 8000) and admitted(policies, pod, NEIGHBOUR, 8001)
            assert admitted(policies, pod, NEIGHBOUR, 8080), "the OpenAI API"
            assert not admitted(policies, pod, CLIENT, 8080), "another namespace: named in the spec only"
            assert not admitted(policies, pod, Source(None, ip="192.0.2.9"), 8000), "nor any address"
            assert not admitted(policies, pod, NEIGHBOUR, 8002)
            assert admitted(policies, pod, MONITORING, 8002)
            assert not admitted(policies, pod, NODE_PROMETHEUS, 8002), "not a configured peer"
            assert not admitted(policies, pod, NEIGHBOUR, 2222), "single pods run no launch agent"
            assert not admitted(policies, pod, Source("default", pod), 2222), "not even from its own kind"


def test_clients_by_namespace_and_address_and_any_source_only_when_named() -> None:
    named = {"clientNamespaceSelector": {"matchLabels": {"team": "ml"}}, "clientCIDRs": ["192.0.2.0/24"]}
    ld = deployment("cpu-reference", networkPolicy=named)
    policies, (pod,) = render(ld)
    kubernetes_validate.validate(policies[0], "1.34.0", strict=True)
    assert admitted(policies, pod, Source("apps", namespace_labels={"team": "ml"}), 8080)
    assert admitted(policies, pod, NEIGHBOUR, 8080), "its own namespace always"
    assert admitted(policies, pod, Source(None, ip="192.0.2.9"), 8000), "a gateway outside pods"
    assert not admitted(policies, pod, Source(None, ip="198.51.100.1"), 8000)
    assert not admitted(policies, pod, CLIENT, 8080)
    anywhere = deployment("cpu-reference", networkPolicy={"clientCIDRs": ["0.0.0.0/0", "::/0"]})
    policies, (pod,) = render(anywhere)
    assert admitted(policies, pod, Source(None, ip="198.51.100.1"), 8000)
    assert not admitted(policies, pod, Source(None, ip="198.51.100.1"), 8002), "metrics stay closed"


@pytest.mark.parametrize("cidr", ["192.0.2.7/24", "10.0.0.0/33", "fd00::1/200", "not-a-cidr"])
def test_a_bad_client_cidr_is_refused_naming_it(cidr: str) -> None:
    with pytest.raises(ValueError, match=r"networkPolicy\.clientCIDRs|String should match pattern"):
        deployment("cpu-reference", networkPolicy={"clientCIDRs": [cidr]})


def test_a_policy_that_admitted_any_source_keeps_doing_so_until_the_spec_names_clients() -> None:
    ld = deployment("cpu-reference-inference-pool")
    policies, (pod,) = render(ld, keep_any_source=True)
    serving, router = policies
    assert network.opened_to_any_source(serving), "stable: the kept policy is found again"
    assert admitted(policies, pod, CLIENT, 8080) and admitted(
        policies, pod, Source(None, ip="198.51.100.1"), 8000
    )
    assert network.KEPT_ANY_SOURCE in serving["metadata"]["annotations"]
    router_pod = router["spec"]["podSelector"]["matchLabels"]
    assert admitted([router], router_pod, CLIENT, 9002), "a gateway that used the picker keeps it"
    # Naming clients ends it; the new policy is not found open, so it stays ended.
    named = deployment("cpu-reference-inference-pool", networkPolicy={"clientCIDRs": ["192.0.2.0/24"]})
    policies, (pod,) = render(named, keep_any_source=True)
    assert not network.opened_to_any_source(policies[0])
    assert not admitted(policies, pod, CLIENT, 8080) and not admitted(policies[1:], router_pod, CLIENT, 9002)
    assert "annotations" not in policies[0]["metadata"]


def test_the_pickers_port_only_from_the_gateways_namespaces() -> None:
    gateways = {"matchLabels": {"kubernetes.io/metadata.name": "istio-gateway"}}
    plain = deployment("cpu-reference-inference-pool")
    (_, router), _ = render(plain)
    router_pod = router["spec"]["podSelector"]["matchLabels"]
    gateway = Source("istio-gateway", {"app": "gateway"})
    assert admitted([router], router_pod, NEIGHBOUR, 8080), "clients of the router's OpenAI port"
    assert not admitted([router], router_pod, NEIGHBOUR, 9002), "its Envoy asks the picker on 127.0.0.1"
    assert not admitted([router], router_pod, gateway, 9002)
    routing = {"mode": "inference-pool", "picker": {"gatewayNamespaceSelector": gateways}}
    (_, router), _ = render(deployment("cpu-reference-inference-pool", routing=routing))
    kubernetes_validate.validate(router, "1.34.0", strict=True)
    assert admitted([router], router_pod, gateway, 9002)
    assert not admitted([router], router_pod, gateway, 8080) and not admitted(
        [router], router_pod, CLIENT, 9002
    )


def test_the_wakers_push_port_only_from_kedas_operator() -> None:
    keda = Source("keda", {"app": "keda-operator"})
    adapter = Source("keda", {"app": "keda-metrics-apiserver"})
    (_, router), _ = render(deployment("cpu-reference-scale-to-zero"))
    kubernetes_validate.validate(router, "1.34.0", strict=True)
    router_pod = router["spec"]["podSelector"]["matchLabels"]
    assert admitted([router], router_pod, keda, 9091)
    for other in (adapter, NEIGHBOUR, CLIENT, MONITORING, Source("other", {"app": "keda-operator"})):
        assert not admitted([router], router_pod, other, 9091), other
    assert not admitted([router], router_pod, keda, 8080)
    (_, router), _ = render(deployment("cpu-reference-scale-to-zero"), keda_namespace="autoscalers")
    assert admitted([router], router_pod, Source("autoscalers", {"app": "keda-operator"}), 9091)
    assert not admitted([router], router_pod, keda, 9091)
    (_, router), _ = render(deployment("cpu-reference-inference-pool"))  # no waker: no such port
    assert not admitted([router], router["spec"]["podSelector"]["matchLabels"], keda, 9091)


@pytest.mark.parametrize("lws", [False, True], ids=["statefulsets", "leaderworkerset"])
def test_the_launch_agent_and_mpi_ports_only_between_the_deployments_multi_node_pods(lws: bool) -> None:
    ld = deployment("llama31-405b-multinode")
    policies, pods = render(ld, leader_worker_set=lws)
    _, canary_pods = render(ld, Slot.B, leader_worker_set=lws)
    roles = {p[L.ROLE] for p in pods}
    assert roles == {"leader", "worker"}
    for pod in pods:
        for peer in pods + canary_pods:
            member = Source("default", peer)
            assert admitted(policies, pod, member, 2222) and admitted(policies, pod, member, 35123)
        assert not admitted(policies, pod, CLIENT, 2222)
        other_deployment = Source("default", {L.DEPLOYMENT: "other", L.GROUP_SIZE: "2"})
        assert not admitted(policies, pod, other_deployment, 2222)
        same_labels_elsewhere = Source("elsewhere", pod)
        assert not admitted(policies, pod, same_labels_elsewhere, 2222), "peers are in its namespace"
        assert not admitted(policies, pod, Source(None, ip="10.1.2.3"), 2222)


def test_client_namespaces_narrow_the_client_ports_and_peers_come_from_the_configuration() -> None:
    selector = {"matchExpressions": [{"key": "team", "operator": "In", "values": ["ml"]}]}
    ld = deployment("cpu-reference", networkPolicy={"clientNamespaceSelector": selector})
    policies, pods = render(ld, metrics_peers=("192.0.2.7/32", "observability"))
    (pod,) = pods
    kubernetes_validate.validate(policies[0], "1.34.0", strict=True)
    assert admitted(policies, pod, Source("apps", namespace_labels={"team": "ml"}), 8000)
    assert not admitted(policies, pod, CLIENT, 8000) and not admitted(policies, pod, CLIENT, 8080)
    assert not admitted(policies, pod, Source(None, ip="192.0.2.9"), 8001), "processes outside pods too"
    assert admitted(policies, pod, NODE_PROMETHEUS, 8002)
    assert admitted(policies, pod, Source("observability"), 8002)
    assert not admitted(policies, pod, MONITORING, 8002), "the default gave way to the configuration"
    policies, pods = render(ld, metrics_peers=())
    assert not any(admitted(policies, pods[0], s, 8002) for s in (MONITORING, NODE_PROMETHEUS, CLIENT))


def test_switched_off_there_is_no_policy_and_the_switch_is_no_new_revision() -> None:
    on = deployment("cpu-reference")
    off = deployment("cpu-reference", networkPolicy={"enabled": False})
    policies, pods = render(off)
    assert policies == [] and pods
    assert revision_of(on.spec, IMAGES) == revision_of(off.spec, IMAGES), "pods do not restart"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("10.0.0.0/33", "LLMOP_METRICS_PEERS: 10.0.0.0/33 is not a CIDR"),
        ("10.0.0.1/8", "LLMOP_METRICS_PEERS: 10.0.0.1/8 is not a CIDR"),
        ("Monitoring", "LLMOP_METRICS_PEERS: Monitoring is neither a namespace name nor a CIDR"),
    ],
)
def test_bad_peers_stop_the_operator_at_start_naming_the_entry(
    text: str, words: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMOP_METRICS_PEERS", text)
    with pytest.raises(ValueError, match=words):
        OperatorConfig.from_env()


def test_the_keda_namespace_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMOP_KEDA_NAMESPACE", raising=False)
    assert OperatorConfig.from_env().keda_namespace == "keda"
    monkeypatch.setenv("LLMOP_KEDA_NAMESPACE", "autoscalers")
    assert OperatorConfig.from_env().keda_namespace == "autoscalers"
    monkeypatch.setenv("LLMOP_KEDA_NAMESPACE", "Keda")
    with pytest.raises(ValueError, match="LLMOP_KEDA_NAMESPACE: 'Keda' is not a namespace name"):
        OperatorConfig.from_env()


def test_peers_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMOP_METRICS_PEERS", raising=False)
    assert OperatorConfig.from_env().metrics_peers == ("monitoring",)
    monkeypatch.setenv("LLMOP_METRICS_PEERS", " monitoring, 192.0.2.7/32 ,fd00::/64")
    assert OperatorConfig.from_env().metrics_peers == ("monitoring", "192.0.2.7/32", "fd00::/64")
    monkeypatch.setenv("LLMOP_METRICS_PEERS", "")
    assert OperatorConfig.from_env().metrics_peers == ()


async def test_the_operator_applies_the_policy_and_removes_it_when_switched_off() -> None:
    from tests.unit.test_reconciler import example, operator_with_nodes, reconcile

    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(example("cpu-reference"))
    await reconcile(kube, reconciler, key)
    assert ("NetworkPolicy", "default", "tiny-llama") in kube.objects
    kube.take_writes()

    body = kube.objects[("LLMDeployment", *key)]
    kube.edit("LLMDeployment", *key, spec={**body["spec"], "networkPolicy": {"enabled": False}})
    await reconcile(kube, reconciler, key)
    writes = [w for w in kube.take_writes() if w[0] != "status"]
    assert writes == [("delete", "NetworkPolicy", "tiny-llama")], "pruned, and the pods left alone"


async def test_upgrading_the_operator_keeps_a_policy_open_to_any_source_until_clients_are_named() -> None:
    from tests.unit.test_reconciler import example, operator_with_nodes, reconcile

    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(example("cpu-reference"))
    await reconcile(kube, reconciler, key)
    policy = kube.objects[("NetworkPolicy", "default", "tiny-llama")]
    assert not network.opened_to_any_source(policy), "a new deployment: its namespace only"
    # What an operator before clients were limited applied: the client rule without `from`.
    client_rule, *others = policy["spec"]["ingress"]
    ingress = [{"ports": client_rule["ports"]}, *others]
    kube.edit("NetworkPolicy", "default", "tiny-llama", spec={**policy["spec"], "ingress": ingress})
    await reconcile(kube, reconciler, key)
    kept = kube.objects[("NetworkPolicy", "default", "tiny-llama")]
    assert network.opened_to_any_source(kept) and network.KEPT_ANY_SOURCE in kept["metadata"]["annotations"]

    body = kube.objects[("LLMDeployment", *key)]
    spec = {**body["spec"], "networkPolicy": {"clientCIDRs": ["192.0.2.0/24"]}}
    kube.edit("LLMDeployment", *key, spec=spec)
    await reconcile(kube, reconciler, key)
    named = kube.objects[("NetworkPolicy", "default", "tiny-llama")]
    assert not network.opened_to_any_source(named)
    assert {"ipBlock": {"cidr": "192.0.2.0/24"}} in named["spec"]["ingress"][0]["from"]
