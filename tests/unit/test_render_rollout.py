"""Rendering of a canary: two slots that share no object, the revision Services, the HTTPRoute and
the revision snapshots. The whole canary render is pinned by a golden file (UPDATE_GOLDEN=1)."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import yaml
from llm_operator import labels as L
from llm_operator.api.v1alpha1 import CpuContract, CpuReferenceSpec, LLMDeployment
from llm_operator.cli import dump_objects
from llm_operator.controller.config import OperatorConfig
from llm_operator.desired import desired, plan_for
from llm_operator.engine.state import BuildFact, BuildObserved
from llm_operator.images import DEFAULT_LAUNCHER_REPOSITORY, Images
from llm_operator.modelrepo import speaks_llmapi
from llm_operator.plan.inventory import Inventory
from llm_operator.render import rollout
from llm_operator.rollout.revision import Slot, revision_of

from e2e.cluster.nodes import build_nodes, load_pools
from tests.golden_files import LAUNCHER_TAG, assert_golden
from tests.unit.model_cache_fixtures import cached

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "rollout" / "cpu-reference-canary.yaml"
# With the golden launcher tag (tests/golden_files.py).
IMAGES = dataclasses.replace(
    OperatorConfig.from_env().images, launcher=f"{DEFAULT_LAUNCHER_REPOSITORY}:{LAUNCHER_TAG}"
)
PARENTS = [{"name": "gw", "namespace": "gateway-system", "sectionName": "http"}]


def deployment(example: str, **spec: Any) -> LLMDeployment:
    doc = yaml.safe_load((REPO / "examples" / f"{example}.yaml").read_text())
    doc["metadata"].update(namespace="default", uid="uid-1")
    doc["spec"].update(spec)
    return LLMDeployment.model_validate(doc)


def render_slot(
    ld: LLMDeployment, slot: Slot, *, lws: bool = False, inventory: Any = None
) -> list[dict[str, Any]]:
    want = desired(
        ld,
        plan_for(ld, inventory),
        IMAGES,
        lambda *_: BuildObserved(BuildFact.RECORDED),
        models=cached,
        slot=slot,
        leader_worker_set=lws,
    )
    return want.children


def canary_render() -> list[dict[str, Any]]:
    """What a canary at 10 % looks like: the stable revision (its snapshot's spec) in slot a at
    two replicas, the edited spec in slot b at one, shared objects of the current spec."""
    canary = {"strategy": "canary", "canary": {"steps": [{"weight": 10}, {"weight": 50}]}}
    stable_ld = deployment("cpu-reference", rollout=canary)
    engine = {**stable_ld.spec.engine.model_dump(mode="json", by_alias=True), "maxBatchSize": 4}
    current = deployment("cpu-reference", rollout=canary, engine=engine)
    stable_rev, canary_rev = revision_of(stable_ld.spec, IMAGES), revision_of(current.spec, IMAGES)
    snapshot = rollout.controller_revision(stable_ld, stable_rev, 1, IMAGES)
    stable = rollout.for_slot(current, rollout.spec_from_snapshot(snapshot), 2)
    out = desired(
        current, plan_for(current, None), IMAGES, lambda *_: BuildObserved(BuildFact.RECORDED), models=cached
    ).shared
    out += render_slot(stable, Slot.A) + render_slot(rollout.for_slot(current, current.spec, 1), Slot.B)
    out += rollout.revision_services(current, stable_rev, canary_rev)
    out.append(rollout.http_route(current, {"stable": 90, "canary": 10}, stable_rev, canary_rev, PARENTS))
    out += [snapshot, rollout.controller_revision(current, canary_rev, 2, IMAGES)]
    return out


def test_canary_render_matches_golden() -> None:
    assert_golden(GOLDEN, dump_objects(canary_render()), "the canary render")


def test_each_slot_runs_its_own_revision_and_replicas() -> None:
    objs = canary_render()
    sets = {o["metadata"]["name"]: o for o in objs if o["kind"] == "StatefulSet"}
    assert set(sets) == {"tiny-llama", "tiny-llama-b"}
    a, b = sets["tiny-llama"], sets["tiny-llama-b"]
    assert (a["spec"]["replicas"], b["spec"]["replicas"]) == (2, 1)
    revisions = {o["metadata"]["labels"][L.REVISION] for o in objs if o["kind"] == "ControllerRevision"}
    assert {s["spec"]["template"]["metadata"]["labels"][L.REVISION] for s in (a, b)} == revisions
    assert len(revisions) == 2
    services = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Service"}
    assert set(services) == {"tiny-llama", "tiny-llama-pods", "tiny-llama-stable", "tiny-llama-canary"}
    for role, sts in (("stable", a), ("canary", b)):
        selector = services[f"tiny-llama-{role}"]["spec"]["selector"]
        assert selector.items() <= sts["spec"]["template"]["metadata"]["labels"].items()
        other = b if sts is a else a
        assert not selector.items() <= other["spec"]["template"]["metadata"]["labels"].items()
    client = services["tiny-llama"]["spec"]["selector"]
    assert all(client.items() <= s["spec"]["template"]["metadata"]["labels"].items() for s in (a, b))


def per_slot_selectors(obj: dict[str, Any]) -> list[dict[str, str]]:
    """Every label selector of a per-slot object that picks pods of one slot."""
    found: list[dict[str, str]] = []
    if obj["kind"] in ("StatefulSet", "PodDisruptionBudget"):
        found.append(obj["spec"]["selector"]["matchLabels"])
    templates = []
    if obj["kind"] == "StatefulSet":
        templates = [obj["spec"]["template"]]
    elif obj["kind"] == "LeaderWorkerSet":
        lwt = obj["spec"]["leaderWorkerTemplate"]
        templates = [lwt["leaderTemplate"], lwt["workerTemplate"]]
    for t in templates:
        affinity = t["spec"].get("affinity", {}).get("podAffinity", {})
        for term in affinity.get("requiredDuringSchedulingIgnoredDuringExecution", []):
            found.append(term["labelSelector"]["matchLabels"])
        for term in affinity.get("preferredDuringSchedulingIgnoredDuringExecution", []):
            found.append(term["podAffinityTerm"]["labelSelector"]["matchLabels"])
    return found


def test_two_slots_of_a_multi_node_deployment_share_no_object_and_no_pod() -> None:
    ld = deployment("llama31-405b-multinode")
    inventory = Inventory()
    for node in build_nodes(load_pools()):
        inventory.upsert(node)
    for lws in (False, True):
        a, b = (render_slot(ld, slot, lws=lws, inventory=inventory) for slot in (Slot.A, Slot.B))
        names_a, names_b = ({(o["kind"], o["metadata"]["name"]) for o in objs} for objs in (a, b))
        assert names_a and not names_a & names_b
        assert all(name.startswith("llama31-405b-b") for _, name in names_b)
        for slot, objs in ((Slot.A, a), (Slot.B, b)):
            for obj in objs:
                assert obj["metadata"]["labels"][L.SLOT] == slot.value, obj["metadata"]["name"]
                selectors = per_slot_selectors(obj)
                assert all(s[L.SLOT] == slot.value for s in selectors), obj["metadata"]["name"]
            text = yaml.safe_dump(objs)
            other = "llama31-405b-b" if slot == Slot.A else "llama31-405b-model-repo"
            assert other not in text, f"slot {slot} refers to an object of the other slot"
        groups = [
            o for o in a + b if o["kind"] == "StatefulSet" and o["metadata"]["labels"][L.ROLE] == "worker"
        ]
        assert lws or groups, "the StatefulSet shape has worker groups whose affinity names their slot"


def test_revision_services_follow_the_revisions() -> None:
    ld = deployment("cpu-reference")
    stable_only = rollout.revision_services(ld, "aaaa", None)
    assert [s["metadata"]["name"] for s in stable_only] == ["tiny-llama-stable"]
    assert stable_only[0]["spec"]["selector"] == {
        L.DEPLOYMENT: "tiny-llama",
        L.ROLE: "leader",
        L.REVISION: "aaaa",
    }
    assert stable_only[0]["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def test_http_route_weights_and_parents() -> None:
    ld = deployment("cpu-reference")
    route = rollout.http_route(ld, {"stable": 100, "canary": 0}, "aaaa", "bbbb", PARENTS)
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1" and route["metadata"]["name"] == "tiny-llama"
    assert route["spec"]["parentRefs"] == PARENTS
    rule, openai = route["spec"]["rules"]
    assert rule["backendRefs"] == [
        {"name": "tiny-llama-stable", "port": 8000, "weight": 100},
        {"name": "tiny-llama-canary", "port": 8000, "weight": 0},
    ]
    assert "matches" not in rule, "Triton's API and everything else"
    # /v1 (the OpenAI API) reaches the same revisions with the same weights, on its own port.
    assert openai == {
        "matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
        "backendRefs": [
            {"name": "tiny-llama-stable", "port": 8080, "weight": 100},
            {"name": "tiny-llama-canary", "port": 8080, "weight": 0},
        ],
    }
    split = rollout.http_route(ld, {"stable": 75, "canary": 25}, "aaaa", "bbbb", PARENTS)["spec"]["rules"]
    assert [[b["weight"] for b in r["backendRefs"]] for r in split] == [[75, 25], [75, 25]]
    no_canary = rollout.http_route(ld, {"stable": 100}, "aaaa", None, PARENTS)
    assert [b["name"] for b in no_canary["spec"]["rules"][0]["backendRefs"]] == ["tiny-llama-stable"]
    assert rollout.http_route(ld, {"stable": 100}, "aaaa", None)["spec"]["parentRefs"] == []


def test_a_snapshot_gives_back_the_spec_and_images_of_its_revision() -> None:
    ld = deployment("llama31-405b-multinode")
    revision = revision_of(ld.spec, IMAGES)
    snapshot = rollout.controller_revision(ld, revision, 3, IMAGES)
    assert snapshot["metadata"]["name"] == f"llama31-405b-{revision}" and snapshot["revision"] == 3
    assert snapshot["metadata"]["labels"][L.REVISION] == revision
    assert snapshot["metadata"]["labels"][L.COMPONENT] == rollout.SNAPSHOT_COMPONENT
    assert rollout.spec_from_snapshot(snapshot) == ld.spec
    assert revision_of(rollout.spec_from_snapshot(snapshot), IMAGES) == revision
    # A slot rendered from its snapshot keeps the images it was started with.
    assert rollout.images_from_snapshot(snapshot) == IMAGES
    assert rollout.images_from_snapshot(rollout.controller_revision(ld, revision, 3)) is None
    # A snapshot of an operator without the images added since: their defaults stand in. One it
    # named that is gone since (the multi-node image, docs/upgrading.md) is left out.
    older = copy.deepcopy(snapshot)
    del older["data"]["images"]["launcher"]
    older["data"]["images"]["multiNodeRuntime"] = "registry.example/triton-trtllm-sshd:25.12"
    assert rollout.images_from_snapshot(older) == Images(
        IMAGES.runtime, IMAGES.cpu_runtime, IMAGES.engine_builder, IMAGES.trtllm_version
    )
    # One written while the operator image copied the launcher: the operator's launcher, from its
    # configured repository, not the default repository's.
    mirror = dataclasses.replace(IMAGES, launcher="mirror.example.com/launcher:0123")
    assert rollout.images_from_snapshot(older, mirror) == dataclasses.replace(
        Images(IMAGES.runtime, IMAGES.cpu_runtime, IMAGES.engine_builder, IMAGES.trtllm_version),
        launcher="mirror.example.com/launcher:0123",
    )
    del older["data"]["images"]["runtime"]
    assert rollout.images_from_snapshot(older) is None, "one it always had is missing: unreadable"


def test_for_slot_changes_the_replicas_not_the_revision() -> None:
    ld = deployment("cpu-reference")
    one = rollout.for_slot(ld, ld.spec, 5)
    assert one.spec.replicas == 5 and one.name == ld.name and ld.spec.replicas == 1
    assert revision_of(one.spec, IMAGES) == revision_of(ld.spec, IMAGES)


def test_a_snapshot_written_while_the_default_backend_was_tensorrt_engine_reads_back_as_engines() -> None:
    """Snapshots leave defaults out: one written before pytorch became the default has no
    engine.backend, and its stable slot serves engines still (its fp8 is no pytorch refusal)."""
    ld = deployment("llama31-405b-multinode")  # tensorrt-engine, fp8
    revision = revision_of(ld.spec, IMAGES)
    snapshot = rollout.controller_revision(ld, revision, 3, IMAGES)
    assert snapshot["data"]["spec"]["engine"]["backend"] == "tensorrt-engine", "written out from now on"
    older = copy.deepcopy(snapshot)
    del older["data"]["spec"]["engine"]["backend"]
    assert rollout.spec_from_snapshot(older) == ld.spec
    assert revision_of(rollout.spec_from_snapshot(older), IMAGES) == revision
    pytorch = deployment("llama31-8b-pytorch")  # the default backend, left out of the example
    snap = rollout.controller_revision(pytorch, revision_of(pytorch.spec, IMAGES), 1, IMAGES)
    assert snap["data"]["spec"]["engine"]["backend"] == "pytorch"
    assert rollout.spec_from_snapshot(snap) == pytorch.spec


def test_a_cpu_snapshot_written_while_the_contract_defaulted_to_the_ensemble_reads_back_as_it() -> None:
    """A cpu-reference snapshot written before pytorch became the contract's default has no
    engine.cpuReference.contract (and none at all when the spec named none): its stable slot keeps
    serving the ensemble. From now on the contract is written out."""
    ld = deployment("cpu-reference")  # names no contract: pytorch now
    snapshot = rollout.controller_revision(ld, revision_of(ld.spec, IMAGES), 1, IMAGES)
    assert snapshot["data"]["spec"]["engine"]["cpuReference"] == {"contract": "pytorch"}
    assert rollout.spec_from_snapshot(snapshot) == ld.spec.model_copy(
        update={"engine": ld.spec.engine.model_copy(update={"cpu_reference": CpuReferenceSpec()})}
    )
    older = copy.deepcopy(snapshot)
    del older["data"]["spec"]["engine"]["cpuReference"]
    assert rollout.spec_from_snapshot(older).engine.cpu_reference == CpuReferenceSpec(
        contract=CpuContract.TENSORRT_ENGINE
    )
    older["data"]["spec"]["engine"]["cpuReference"] = {}
    assert not speaks_llmapi(rollout.spec_from_snapshot(older))
    assert speaks_llmapi(rollout.spec_from_snapshot(snapshot))
