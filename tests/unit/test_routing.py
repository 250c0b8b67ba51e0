"""routing.mode inference-pool: the InferencePool and its router, rendered (pure builders) and
reconciled (against tests/unit/fake_kube.py): what is applied, what status says while the router
is up, down or its API missing, and that switching back to routing.mode service removes it all."""

from __future__ import annotations

import copy
import dataclasses
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from llm_operator import labels as L
from llm_operator.api.v1alpha1 import LLMDeployment, LLMDeploymentSpec
from llm_operator.controller.config import OperatorConfig
from llm_operator.desired import desired, plan_for
from llm_operator.engine.state import BuildFact, BuildObserved
from llm_operator.render.router import objects as routing
from llm_operator.rollout.revision import Slot, revision_of
from pydantic import ValidationError

from tests.unit.fake_kube import FakeKube
from tests.unit.test_reconciler import EXAMPLES, NS, condition, operator_with_nodes, reconcile, rolled_out

NAME = "tiny-llama-routed"
ROUTER = f"{NAME}-router"
ROUTER_KINDS = (
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "ConfigMap",
    "Deployment",
    "Service",
    "InferencePool",
)


def pool_example(failure_mode: str = "FailOpen") -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load((EXAMPLES / "cpu-reference-inference-pool.yaml").read_text())
    body["spec"]["routing"]["picker"]["failureMode"] = failure_mode
    return body


def router_available(kube: FakeKube, available: bool) -> None:
    """What the Deployment controller reports of the router."""
    obj = kube.objects[("Deployment", NS, ROUTER)]
    kube.edit("Deployment", NS, ROUTER, status={
        "observedGeneration": obj["metadata"]["generation"], "replicas": 1,
        "readyReplicas": 1 if available else 0,
        "conditions": [{"type": "Available", "status": str(available),
                        "message": "Deployment has minimum availability." if available
                        else "Deployment does not have minimum availability."}],
    })  # fmt: skip


def all_rendered(ld: LLMDeployment, slot: Slot = Slot.A) -> list[dict[str, Any]]:
    images = OperatorConfig.from_env().images
    want = desired(ld, plan_for(ld, None), images, lambda *_: BuildObserved(BuildFact.ABSENT), slot=slot)
    return want.shared + want.children


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def test_the_pool_selects_the_leaders_of_both_slots_and_the_router_is_no_replica() -> None:
    ld = LLMDeployment.model_validate({**pool_example(), "metadata": {"name": NAME, "namespace": NS}})
    objs = {(o["kind"], o["metadata"]["name"]): o for o in all_rendered(ld)}
    pool = objs[("InferencePool", NAME)]["spec"]
    assert pool["targetPorts"] == [{"number": 8080}]
    assert pool["endpointPickerRef"] == {"name": ROUTER, "port": {"number": 9002}, "failureMode": "FailOpen"}
    for slot in Slot:
        (serving,) = [o for o in all_rendered(ld, slot) if o["kind"] == "StatefulSet"]
        assert matches(pool["selector"]["matchLabels"], serving["spec"]["template"]["metadata"]["labels"])
    router_pod = objs[("Deployment", ROUTER)]["spec"]["template"]["metadata"]["labels"]
    assert not matches(pool["selector"]["matchLabels"], router_pod)
    assert not matches(objs[("Service", NAME)]["spec"]["selector"], router_pod), "the client Service"
    serving_policy = objs[("NetworkPolicy", NAME)]["spec"]
    assert not matches(serving_policy["podSelector"]["matchLabels"], router_pod)
    assert L.MANAGED_BY not in router_pod, "the operator's pod watch is for serving pods"
    # The router may reach the leaders' OpenAI API and the metrics the picker scrapes.
    from_router = [
        r
        for r in serving_policy["ingress"]
        if r.get("from") == [{"podSelector": {"matchLabels": router_pod}}]
    ]
    assert [p["port"] for p in from_router[0]["ports"]] == [8080, 8002]
    router_policy = objs[("NetworkPolicy", ROUTER)]["spec"]
    assert router_policy["podSelector"]["matchLabels"] == router_pod
    assert [p["port"] for p in router_policy["ingress"][0]["ports"]] == [8080], "9002: gateways named only"
    # The Service the pool's endpointPickerRef names serves the picker's ext_proc port.
    ports = {p["port"]: p["targetPort"] for p in objs[("Service", ROUTER)]["spec"]["ports"]}
    assert ports == {8080: "openai", 9002: "grpc"}
    # It is TLS: a gateway that trusts appProtocol must not be told cleartext HTTP/2 (h2c).
    assert all("appProtocol" not in p for p in objs[("Service", ROUTER)]["spec"]["ports"])


@pytest.mark.parametrize("failure_mode", ["FailClose", "FailOpen"])
def test_the_router_stays_behind_its_service_while_its_picker_is_not_ready(failure_mode: str) -> None:
    """The picker's readiness makes the router pod unready (PickerReady follows it), yet Envoy must
    still be reached to answer as the failure mode says: kube-proxy would refuse the connection."""
    body = pool_example(failure_mode)
    ld = LLMDeployment.model_validate({**body, "metadata": {"name": NAME, "namespace": NS}})
    objs = {(o["kind"], o["metadata"]["name"]): o for o in all_rendered(ld)}
    containers = objs[("Deployment", ROUTER)]["spec"]["template"]["spec"]["containers"]
    epp = next(c for c in containers if c["name"] == "epp")
    assert epp["readinessProbe"]["grpc"] == {"port": 9003, "service": "inference-extension"}
    assert epp["livenessProbe"]["grpc"] == epp["readinessProbe"]["grpc"], "a picker that hangs is restarted"
    assert objs[("Service", ROUTER)]["spec"]["publishNotReadyAddresses"] is True


def test_only_the_picker_holds_an_api_token_envoy_which_faces_clients_holds_none() -> None:
    ld = LLMDeployment.model_validate({**pool_example(), "metadata": {"name": NAME, "namespace": NS}})
    objs = {(o["kind"], o["metadata"]["name"]): o for o in all_rendered(ld)}
    pod = objs[("Deployment", ROUTER)]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False, "no token in every container by default"
    mounts = {c["name"]: {m["mountPath"] for m in c["volumeMounts"]} for c in pod["containers"]}
    assert routing.TOKEN_MOUNT in mounts["epp"] and routing.TOKEN_MOUNT not in mounts["envoy"]
    (token,) = [v for v in pod["volumes"] if v["name"] == routing.TOKEN_VOLUME]
    kinds = [next(iter(source)) for source in token["projected"]["sources"]]
    assert kinds == ["serviceAccountToken", "configMap", "downwardAPI"], "what the API server would mount"


def test_service_mode_renders_no_router() -> None:
    body = pool_example()
    del body["spec"]["routing"]
    ld = LLMDeployment.model_validate({**body, "metadata": {"name": NAME, "namespace": NS}})
    kinds = {o["kind"] for o in all_rendered(ld)}
    assert not kinds & {"InferencePool", "Deployment", "Role", "RoleBinding", "ServiceAccount"}
    assert routing.openai_endpoint(ld) is None


def test_routing_and_the_router_images_are_no_new_revision() -> None:
    """Pods do not restart when the routing mode or the router's images change."""
    body = pool_example()["spec"]
    spec = LLMDeploymentSpec.model_validate(body)
    plain = LLMDeploymentSpec.model_validate({k: v for k, v in body.items() if k != "routing"})
    images = OperatorConfig.from_env().images
    other = dataclasses.replace(images, picker="mirror/epp:1", envoy="mirror/envoy:2")
    assert revision_of(spec, images) == revision_of(plain, images) == revision_of(spec, other)


@pytest.mark.parametrize(
    ("routing", "rollout", "words"),
    [
        ({"mode": "service", "picker": {"failureMode": "FailOpen"}}, None, "routing.picker is used only"),
        (
            {"mode": "inference-pool"},
            {"strategy": "canary", "canary": {"steps": [{"weight": 10}], "trafficRouting": "gateway-api",
                                               "gateway": {"parentRefs": [{"name": "gw"}]}}},
            "trafficRouting replica-ratio",
        ),
    ],
    ids=["picker-without-pool", "gateway-api-canary-with-pool"],
)  # fmt: skip
def test_refused_combinations(routing: dict[str, Any], rollout: dict[str, Any] | None, words: str) -> None:
    spec = copy.deepcopy(pool_example()["spec"])
    spec["routing"] = routing
    if rollout is not None:
        spec["rollout"] = rollout
    with pytest.raises(ValidationError, match=words):
        LLMDeploymentSpec.model_validate(spec)


async def test_the_router_is_applied_and_status_follows_it() -> None:
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(pool_example("FailClose"))
    await reconcile(kube, reconciler, key)
    for kind in ROUTER_KINDS:
        name = NAME if kind == "InferencePool" else ROUTER
        assert (kind, NS, name) in kube.objects, kind
    status = kube.objects[("LLMDeployment", *key)]["status"]
    assert status["endpoints"]["openai"] == f"http://{ROUTER}.{NS}.svc:8080/v1"
    assert status["endpoints"]["http"] == f"http://{NAME}.{NS}.svc:8000", "Triton's API stays on the Service"
    assert condition(kube, NAME, "PickerReady")["reason"] == "PickerUnavailable"

    rolled_out(kube, NAME, 3)
    router_available(kube, True)
    await reconcile(kube, reconciler, key)
    assert condition(kube, NAME, "Ready")["status"] == "True"
    assert condition(kube, NAME, "PickerReady")["status"] == "True"

    router_available(kube, False)
    await reconcile(kube, reconciler, key)
    ready = condition(kube, NAME, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "PickerUnavailable")
    assert "FailClose" in ready["message"] and "answers 503" in ready["message"]
    assert "does not have minimum availability" in ready["message"], "the Deployment's own words"
    assert condition(kube, NAME, "Degraded")["status"] == "True"
    assert ("Warning", "PickerUnavailable") in [(t, r) for t, r, _ in kube.events]


async def test_fail_open_says_the_deployment_still_serves() -> None:
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(pool_example("FailOpen"))
    await reconcile(kube, reconciler, key)
    rolled_out(kube, NAME, 3)
    router_available(kube, False)
    await reconcile(kube, reconciler, key)
    message = condition(kube, NAME, "PickerReady")["message"]
    assert "FailOpen" in message and "still reach ready replicas" in message
    assert condition(kube, NAME, "Available")["status"] == "True"


async def test_a_cluster_without_the_inference_pool_api_stalls_and_keeps_serving() -> None:
    kube, reconciler = await operator_with_nodes()
    kube.missing_kinds = {"InferencePool"}
    key = kube.add_deployment(pool_example())
    await reconcile(kube, reconciler, key)
    stalled = condition(kube, NAME, "Stalled")
    assert (stalled["status"], stalled["reason"]) == ("True", "InferencePoolCrdMissing")
    assert (
        "gateway-api-inference-extension" in stalled["message"]
        and "routing.mode service" in stalled["message"]
    )
    assert ("StatefulSet", NS, NAME) in kube.objects and ("Deployment", NS, ROUTER) in kube.objects

    kube.missing_kinds = set()  # the CRDs installed: the next pass applies the pool
    rolled_out(kube, NAME, 3)
    router_available(kube, True)
    await reconcile(kube, reconciler, key)
    assert ("InferencePool", NS, NAME) in kube.objects
    assert condition(kube, NAME, "Ready")["status"] == "True"


async def test_back_to_service_mode_removes_the_pool_and_the_router() -> None:
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(pool_example())
    await reconcile(kube, reconciler, key)
    spec = copy.deepcopy(kube.objects[("LLMDeployment", *key)]["spec"])
    del spec["routing"]
    kube.edit("LLMDeployment", NS, NAME, spec=spec)
    await reconcile(kube, reconciler, key)
    for kind in ROUTER_KINDS:
        assert (kind, NS, NAME if kind == "InferencePool" else ROUTER) not in kube.objects, kind
    assert ("NetworkPolicy", NS, ROUTER) not in kube.objects
    status = kube.objects[("LLMDeployment", *key)]["status"]
    assert status["endpoints"]["openai"] == f"http://{NAME}.{NS}.svc:8080/v1"
    assert "PickerReady" not in {c["type"] for c in status["conditions"]}
    assert ("StatefulSet", NS, NAME) in kube.objects


async def test_a_canary_leaves_the_router_as_it_is() -> None:
    """The router's limits follow spec.replicas (render/router/limits.py), and a changed ConfigMap
    restarts the router: a canary's split of the replicas between the slots must not change them,
    or every step cuts the traffic the analysis measures."""
    body = pool_example()
    body["spec"]["replicas"] = 2  # a slot's 1 would halve the limits' replica ceiling
    body["spec"]["rollout"] = {"strategy": "canary", "canary": {"steps": [{"weight": 50}]}}
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(body)
    await reconcile(kube, reconciler, key)
    rolled_out(kube, NAME, 2)
    router_available(kube, True)
    await reconcile(kube, reconciler, key)
    before = copy.deepcopy(kube.objects[("ConfigMap", NS, ROUTER)]["data"])

    spec = copy.deepcopy(kube.objects[("LLMDeployment", *key)]["spec"])
    spec["runtime"]["env"] = [{"name": "RELEASE_NOTE", "value": "v2"}]
    kube.edit("LLMDeployment", NS, NAME, spec=spec)
    await reconcile(kube, reconciler, key)
    canary = kube.objects[("StatefulSet", NS, f"{NAME}-b")]
    assert canary["spec"]["replicas"] == 1, "the canary slot holds its share of the replicas"
    assert kube.objects[("ConfigMap", NS, ROUTER)]["data"] == before


CACHE = Path(os.environ.get("LLMOP_CACHE", Path.home() / ".cache" / "llm-operator")) / "bin"


def crd_schema(pattern: str) -> dict[str, Any] | None:
    """The v1 schema of a CRD e2e/cluster/build-tools.sh cached (the Gateway API's beside Traefik,
    the Inference Extension's beside the EPP); None when it is not there."""
    found = sorted(CACHE.glob(pattern))
    if not found:
        return None
    crd = yaml.safe_load(found[-1].read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def test_the_httproute_example_routes_to_the_rendered_pool() -> None:
    """examples/httproute-inference-pool.yaml names the pool examples/cpu-reference-inference-pool.yaml
    renders, by the group and kind a conformant gateway resolves; and both validate against the
    CRDs (Gateway API v1 HTTPRoute, Inference Extension v1 InferencePool) where they are cached."""
    route = yaml.safe_load((EXAMPLES / "httproute-inference-pool.yaml").read_text())
    ld = LLMDeployment.model_validate({**pool_example(), "metadata": {"name": NAME, "namespace": NS}})
    (pool,) = [o for o in all_rendered(ld) if o["kind"] == "InferencePool"]
    (rule,) = route["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    group, _, version = pool["apiVersion"].partition("/")
    assert (backend["group"], backend["kind"], backend["name"]) == (
        group,
        pool["kind"],
        pool["metadata"]["name"],
    )
    assert version == "v1"
    checked = 0
    schemas = {
        "traefik-*/crds/gateway.networking.k8s.io_httproutes.yaml": route,
        "epp-v1.5.0-*/crds/inference.networking.k8s.io_inferencepools.yaml": pool,
    }
    for pattern, obj in schemas.items():
        schema = crd_schema(pattern)
        if schema is not None:
            jsonschema.validate({k: v for k, v in obj.items() if k != "metadata"}, schema)
            checked += 1
    if not checked:
        pytest.skip("no cached Gateway API or Inference Extension CRDs (e2e/cluster/build-tools.sh)")
