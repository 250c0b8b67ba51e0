"""Render tier: every name the LeaderWorkerSet controller derives from a rendered LeaderWorkerSet is
free in the namespace, and a leader's mpirun reaches exactly the host names LWS gives its workers.

LWS's real controller runs in one e2e module only (tests/e2e/test_lws_multi_node.py: v0.9.0, the
newest release whose module the Go proxy serves), so here `lws_names` models it from its source
at kubernetes-sigs/lws tag v0.10.0 (commit 2161f38f; the e2e sees the same names from v0.9.0's):
- pkg/controllers/leaderworkerset_controller.go: the leader StatefulSet `<lws>` with serviceName
  `<lws>`; reconcileHeadlessServices: the headless Service `<lws>` (CreateHeadlessServiceIfNotExists
  in pkg/utils/controller/controller_utils.go, which keeps any Service already under that name)
  when networkConfig is unset or its subdomainPolicy is Shared.
- pkg/controllers/pod_controller.go: per leader pod `<lws>-<group>` a worker StatefulSet of the same
  name, ordinals from 1, serviceName `<lws>` (Shared) or the leader pod's name (UniquePerReplica,
  which also gets a headless Service of that name).
- pkg/webhooks/pod_webhook.go: UniquePerReplica sets a leader pod's subdomain to its own name;
  pkg/utils/pod/pod_utils.go AddLWSVariables: LWS_LEADER_ADDRESS `<lws>-<group>.<subdomain>.<ns>`.
- pkg/utils/revision/revision_utils.go revisionName: ControllerRevisions `<lws>-<hash>-<number>`
  (LWS keeps them; so does the StatefulSet controller, `<statefulset>-<hash>`).
- Kubernetes' StatefulSet controller: pods `<statefulset>-<ordinal>`, hostname the pod's name,
  subdomain the serviceName.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator import labels as L
from llm_operator.api.v1alpha1 import LLMDeployment
from llm_operator.controller.cluster.kube import obj_key
from llm_operator.controller.config import OperatorConfig
from llm_operator.controller.observe.groups import LWS_NAME
from llm_operator.controller.observe.observe import pool_observed
from llm_operator.desired import desired, plan_for
from llm_operator.engine.state import BuildFact, BuildObserved
from llm_operator.labels import SLOT
from llm_operator.plan.inventory import Inventory
from llm_operator.render import rollout
from llm_operator.render.serving import POD_INDEX
from llm_operator.rollout.revision import Slot, revision_of
from llm_operator.runtime.commands import worker_hosts
from llm_operator.runtime.config import PodConfig

from e2e.cluster.nodes import build_nodes, load_pools
from tests.unit.model_cache_fixtures import cached
from tests.unit.test_reconciler import multi_node, operator_with_nodes, reconcile

REPO = Path(__file__).resolve().parents[2]
IMAGES = OperatorConfig.from_env().images
NAMESPACE = "ns"
GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
# Both controllers' revision hashes: k8s.io/apimachinery/pkg/util/rand SafeEncodeString's alphabet.
HASH = "[bcdfghjklmnpqrstvwxz2456789]+"
Name = tuple[str, str]  # (kind, name) in the namespace


@dataclass
class LwsNames:
    """What LWS's controllers create for one LeaderWorkerSet, and the pods' DNS names."""

    objects: set[Name] = field(default_factory=set)
    revisions: list[re.Pattern[str]] = field(default_factory=list)  # ControllerRevision names
    fqdns: dict[tuple[int, int], str] = field(default_factory=dict)  # (group, worker) -> host
    leader_address: dict[int, str] = field(default_factory=dict)  # group -> LWS_LEADER_ADDRESS


def lws_names(lws: dict[str, Any]) -> LwsNames:
    name, namespace = lws["metadata"]["name"], lws["metadata"]["namespace"]
    spec = lws["spec"]
    size = spec["leaderWorkerTemplate"]["size"]
    policy = (spec.get("networkConfig") or {}).get("subdomainPolicy", "Shared")
    out = LwsNames(objects={("StatefulSet", name)})
    out.revisions += [
        re.compile(rf"{re.escape(name)}-{HASH}-[0-9]+"),
        re.compile(rf"{re.escape(name)}-{HASH}"),
    ]
    if policy == "Shared":
        out.objects.add(("Service", name))
    for group in range(spec["replicas"]):
        leader = f"{name}-{group}"
        subdomain = name if policy == "Shared" else leader
        if policy != "Shared":
            out.objects.add(("Service", leader))
        out.objects |= {("Pod", leader), ("StatefulSet", leader)}
        out.revisions.append(re.compile(rf"{re.escape(leader)}-{HASH}"))
        out.fqdns[(group, 0)] = f"{leader}.{subdomain}.{namespace}.svc"
        out.leader_address[group] = f"{leader}.{subdomain}.{namespace}"
        for worker in range(1, size):
            out.objects.add(("Pod", f"{leader}-{worker}"))
            out.fqdns[(group, worker)] = f"{leader}-{worker}.{subdomain}.{namespace}.svc"
    return out


def deployment(example: str, name: str | None = None, **spec: Any) -> LLMDeployment:
    doc = yaml.safe_load((REPO / "examples" / f"{example}.yaml").read_text())
    doc["metadata"].update(namespace=NAMESPACE, uid="uid-1", **({"name": name} if name else {}))
    doc["spec"].update(spec)
    return LLMDeployment.model_validate(doc)


def two_pools() -> LLMDeployment:
    """Pool `pods` (4-GPU L40S nodes: two pods a replica) beside pool `h100` (one pod a replica);
    `pods` is also the suffix of the deployment's headless Service."""
    pools = [
        {"name": "pods", "products": ["NVIDIA-L40S"]},
        {"name": "h100", "products": ["NVIDIA-H100-80GB-HBM3"]},
    ]
    return deployment(
        "llama3-70b-fp8",
        parallelism={"tensor": 4, "pipeline": 2},
        replicas=4,
        autoscaling=None,
        resources={"gpu": {"pools": pools, "poolPolicy": "weighted"}},
    )


DEPLOYMENTS = {
    "one-pool": lambda: deployment("llama31-405b-multinode", replicas=2),
    "two-pools": two_pools,
    "inference-pool": lambda: deployment("llama31-405b-multinode", routing={"mode": "inference-pool"}),
    "pytorch": lambda: deployment("llama31-405b-pytorch-multinode", replicas=2),
}


def inventory() -> Inventory:
    inv = Inventory()
    for node in build_nodes(load_pools()):
        inv.upsert(node)
    return inv


def built(*_: Any) -> BuildObserved:
    return BuildObserved(BuildFact.RECORDED)


def rendered(ld: LLMDeployment, *, lws: bool) -> list[dict[str, Any]]:
    """Everything the operator renders for `ld` in its namespace: both slots of a canary, the shared
    objects, the revision Services, HTTPRoute and snapshots, and the pods of its own StatefulSets."""
    plan = plan_for(ld, inventory())
    objs: list[dict[str, Any]] = []
    for slot in (Slot.A, Slot.B):
        want = desired(ld, plan, IMAGES, built, models=cached, slot=slot, leader_worker_set=lws)
        objs += want.children + want.jobs + (want.shared if slot == Slot.A else [])
    stable, canary = revision_of(ld.spec, IMAGES), "0123456789"
    objs += rollout.revision_services(ld, stable, canary)
    objs.append(rollout.http_route(ld, {"stable": 90, "canary": 10}, stable, canary, []))
    objs += [rollout.controller_revision(ld, stable, 1, IMAGES), rollout.controller_revision(ld, canary, 2)]
    return objs


def operator_names(objs: list[dict[str, Any]]) -> set[Name]:
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    for o in objs:
        if o["kind"] == "StatefulSet":
            start = (o["spec"].get("ordinals") or {}).get("start", 0)
            names |= {
                ("Pod", f"{o['metadata']['name']}-{i}") for i in range(start, start + o["spec"]["replicas"])
            }
    return names


def leader_worker_sets(objs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    found = [o for o in objs if o["kind"] == "LeaderWorkerSet"]
    assert found, "multi-node pools render LeaderWorkerSets"
    yield from found


@pytest.mark.parametrize("make", DEPLOYMENTS.values(), ids=DEPLOYMENTS.keys())
def test_no_name_lws_derives_is_one_the_operator_renders_or_another_lws_derives(make: Any) -> None:
    objs = rendered(make(), lws=True)
    ours = operator_names(objs)
    revisions = {name for kind, name in ours if kind == "ControllerRevision"}
    seen: dict[Name, str] = {}
    for lws in leader_worker_sets(objs):
        theirs = lws_names(lws)
        lws_name = lws["metadata"]["name"]
        assert not theirs.objects & ours, (
            f"LeaderWorkerSet {lws_name}'s controller would meet {theirs.objects & ours}"
        )
        for pattern in theirs.revisions:
            assert not [r for r in revisions if pattern.fullmatch(r)], f"{pattern.pattern} vs {revisions}"
        for obj in theirs.objects:
            assert seen.setdefault(obj, lws_name) == lws_name, f"{obj} from {seen[obj]} and {lws_name}"


@pytest.mark.parametrize("make", DEPLOYMENTS.values(), ids=DEPLOYMENTS.keys())
def test_the_pods_dns_names_are_theirs_alone(make: Any) -> None:
    """A pod's FQDN is hostname.subdomain: LWS's Service must not be one the operator renders (a
    ClusterIP Service publishes no pod records), so no operator pod shares a FQDN either."""
    objs = rendered(make(), lws=True)
    headless = {o["spec"]["serviceName"] for o in objs if o["kind"] == "StatefulSet"}
    operator_fqdns = {f"{pod}.{svc}.{NAMESPACE}.svc" for kind, pod in operator_names(objs) if kind == "Pod"
                      for svc in headless}  # fmt: skip
    services = {name for kind, name in operator_names(objs) if kind == "Service"}
    for lws in leader_worker_sets(objs):
        fqdns = set(lws_names(lws).fqdns.values())
        assert not fqdns & operator_fqdns
        assert not {h.split(".")[1] for h in fqdns} & services


def pod_env(container: dict[str, Any], labels: dict[str, str], name: str) -> dict[str, str]:
    """The container's environment as the kubelet resolves it (Secret references left out)."""
    env: dict[str, str] = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        elif path := e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath"):
            label = re.fullmatch(r"metadata\.labels\['(.+)'\]", path)
            env[e["name"]] = labels[label.group(1)] if label else name
    return env


@pytest.mark.parametrize("make", DEPLOYMENTS.values(), ids=DEPLOYMENTS.keys())
def test_the_leader_waits_for_and_launches_on_exactly_the_workers_lws_names(make: Any) -> None:
    for lws in leader_worker_sets(rendered(make(), lws=True)):
        theirs = lws_names(lws)
        template = lws["spec"]["leaderWorkerTemplate"]
        size = template["size"]
        for group in range(lws["spec"]["replicas"]):
            leader = f"{lws['metadata']['name']}-{group}"
            labels = {GROUP_INDEX: str(group)}
            env = pod_env(template["leaderTemplate"]["spec"]["containers"][0], labels, leader)
            c = PodConfig.from_env({**env, "LWS_LEADER_ADDRESS": theirs.leader_address[group]})
            assert worker_hosts(c) == [theirs.fqdns[(group, w)] for w in range(1, size)]
            worker = f"{leader}-1"
            env = pod_env(template["workerTemplate"]["spec"]["containers"][0], labels, worker)
            c = PodConfig.from_env({**env, "LWS_LEADER_ADDRESS": theirs.leader_address[group]})
            assert f"{c.leader_host}.svc" == theirs.fqdns[(group, 0)], "a worker finds its own leader"


def test_the_status_reads_the_leader_worker_set_under_the_name_it_is_rendered_with() -> None:
    ld = deployment("llama31-405b-multinode", replicas=2)
    plan = plan_for(ld, inventory())
    (lws,) = [o for o in leader_worker_sets(rendered(ld, lws=True)) if o["metadata"]["labels"][SLOT] == "a"]
    lws = {**lws, "status": {"readyReplicas": 1, "updatedReplicas": 2}}
    observed = pool_observed({obj_key(lws): lws}, {}, ld, plan.pools[0], Slot.A)
    assert (observed.exists, observed.ready, observed.rolled_out) == (True, 1, True)


def test_a_long_deployment_name_still_gives_lws_pods_and_revision_labels_that_fit() -> None:
    """Worker pods `<lws>-<group>-<worker>` are host names (63), and the StatefulSet controller labels
    them `controller-revision-hash: <lws>-<group>-<hash of up to 10>` (a label value: 63); groups
    number up to 999 (spec.replicas <= 1000)."""
    ld = deployment("llama31-405b-multinode", name="a" * 63)
    for lws in leader_worker_sets(rendered(ld, lws=True)):
        last_group = f"{lws['metadata']['name']}-999"
        assert len(f"{last_group}-{'x' * 10}") <= 63
        assert len(f"{last_group}-{lws['spec']['leaderWorkerTemplate']['size'] - 1}") <= 63


async def test_a_failed_member_of_an_lws_group_is_reported_and_lws_left_to_recreate_the_group() -> None:
    """LWS recreates the group (RecreateGroupOnPodRestart); the operator names the member that
    failed and why, as for its own groups, and deletes nothing. The group is the LWS's group-index
    label: a worker's pod-index is its rank."""
    kube, reconciler = await operator_with_nodes()
    reconciler.leader_worker_set = True  # what it finds at start where the LWS CRD is installed
    key = kube.add_deployment(multi_node())
    await reconcile(kube, reconciler, key)
    (lws,) = kube.of_kind("LeaderWorkerSet")
    size = kube.objects[("LeaderWorkerSet", key[0], lws)]["spec"]["leaderWorkerTemplate"]["size"]
    kube.take_writes()
    leader = {
        "metadata": {
            "name": f"{lws}-1", "namespace": key[0], "uid": "leader-1",
            "labels": {L.DEPLOYMENT: key[1], L.POOL: "main", L.SLOT: "a", L.ROLE: "leader",
                       L.GROUP_SIZE: str(size), LWS_NAME: lws, GROUP_INDEX: "1", POD_INDEX: "1"},
        },
        "status": {"phase": "Running", "containerStatuses": [{"restartCount": 1, "lastState": {"terminated": {
            "exitCode": 1, "reason": "Error", "message": "ORTE has lost communication with a remote daemon",
        }}}]},
    }  # fmt: skip
    await reconciler.pod_event("MODIFIED", leader)
    await reconciler.reconcile(*key)
    assert not [w for w in kube.take_writes() if w[1] == "Pod"], "LWS recreates the group, not the operator"
    workers = ", ".join(f"{lws}-1-{w}" for w in range(1, size))
    assert kube.events[-1] == ("Warning", "GroupRecreated", (
        f"{lws}-1 failed (exited 1 (Error): ORTE has lost communication with a remote daemon): "
        f"LeaderWorkerSet {lws} recreates group 1 of pool main as a whole ({lws}-1, {workers})"))  # fmt: skip
