"""The operator's side of the OpenAI API: what the leader is told to serve (its names, its tokenizer,
its port), every Service clients use exposing that port, and status.endpoints.openai in every
rollout mode. The server itself is tested with its own code (llm_operator.frontdoor); real
clients on real pods in tests/e2e/test_real_pods.py."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest
from llm_operator import contract
from llm_operator import labels as L
from llm_operator.api.v1alpha1 import ModelSpec
from llm_operator.plan.inventory import Inventory
from llm_operator.render import services
from llm_operator.rollout.revision import Slot

from e2e.cluster.nodes import build_nodes, load_pools
from tests.unit.test_reconciler import NS, example, operator_with_nodes, reconcile
from tests.unit.test_render_rollout import canary_render, deployment, render_slot

OPENAI_PORT = {"name": "openai", "port": 8080, "targetPort": "openai", "protocol": "TCP"}


def serving_containers(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """role -> the serving container of that role's pod template."""
    out = {}
    for obj in objs:
        if obj["kind"] == "StatefulSet":
            template = obj["spec"]["template"]
            role = template["metadata"]["labels"][L.ROLE]
            out[role] = template["spec"]["containers"][0]
    return out


def env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def test_the_leader_serves_the_model_name_then_its_alias_and_workers_serve_nothing() -> None:
    inventory = Inventory()
    for node in build_nodes(load_pools()):
        inventory.upsert(node)
    ld = deployment("llama31-405b-multinode")
    model = {**ld.spec.model.model_dump(mode="json", by_alias=True), "alias": "llama-405b"}
    containers = serving_containers(render_slot(deployment("llama31-405b-multinode", model=model), Slot.A,
                                                inventory=inventory))  # fmt: skip
    assert set(containers) == {"leader", "worker"}
    names = f"{ld.spec.model.name},llama-405b"
    assert env(containers["leader"])["LLMOP_SERVED_MODEL_NAMES"] == names
    assert "LLMOP_SERVED_MODEL_NAMES" not in env(containers["worker"]), "ranks > 0 serve no API"
    for container in containers.values():
        assert env(container)["LLMOP_OPENAI_PORT"] == "8080"
        assert {"name": "openai", "containerPort": 8080} in container["ports"]

    (tiny,) = serving_containers(render_slot(deployment("cpu-reference"), Slot.A)).values()
    assert env(tiny)["LLMOP_SERVED_MODEL_NAMES"] == "llm-operator/tiny-llama,tiny-llama"
    model = {"name": "llm-operator/tiny-llama", "source": {"uri": "builtin://tiny-llama"}}
    (alone,) = serving_containers(render_slot(deployment("cpu-reference", model=model), Slot.A)).values()
    assert env(alone)["LLMOP_SERVED_MODEL_NAMES"] == "llm-operator/tiny-llama", "no alias: the name only"


def test_the_leader_checks_requests_against_the_limits_the_model_enforces() -> None:
    """spec.engine's maxInputLen and maxSeqLen; a builtin model has no more positions than its own
    (tiny-llama: 512), which its model repository enforces too."""
    (tiny,) = serving_containers(render_slot(deployment("cpu-reference"), Slot.A)).values()
    assert (env(tiny)["LLMOP_MAX_INPUT_LEN"], env(tiny)["LLMOP_MAX_SEQ_LEN"]) == ("256", "512")
    engine = {**deployment("cpu-reference").spec.engine.model_dump(mode="json", by_alias=True),
              "maxInputLen": 4096, "maxSeqLen": 8192}  # fmt: skip
    (clamped,) = serving_containers(render_slot(deployment("cpu-reference", engine=engine), Slot.A)).values()
    assert (env(clamped)["LLMOP_MAX_INPUT_LEN"], env(clamped)["LLMOP_MAX_SEQ_LEN"]) == ("512", "512")
    (gpu,) = serving_containers(render_slot(deployment("llama3-8b-h100"), Slot.A)).values()
    spec = deployment("llama3-8b-h100").spec.engine
    assert env(gpu)["LLMOP_MAX_SEQ_LEN"] == str(spec.max_seq_len)
    assert env(gpu)["LLMOP_MAX_INPUT_LEN"] == str(spec.max_input_len)


def test_the_leader_reads_tool_calls_with_the_parser_the_spec_names_and_no_other() -> None:
    """spec.model.toolCallParser reaches the front door (tool_choice auto); unset, nothing is set
    (auto is refused there); a parser the API does not know is refused at admission."""
    (plain,) = serving_containers(render_slot(deployment("cpu-reference"), Slot.A)).values()
    assert "LLMOP_TOOL_CALL_PARSER" not in env(plain)
    model = {**deployment("cpu-reference").spec.model.model_dump(mode="json", by_alias=True),
             "toolCallParser": "hermes"}  # fmt: skip
    (tools,) = serving_containers(render_slot(deployment("cpu-reference", model=model), Slot.A)).values()
    assert env(tools)["LLMOP_TOOL_CALL_PARSER"] == "hermes"
    with pytest.raises(pydantic.ValidationError, match="toolCallParser"):
        ModelSpec.model_validate({**model, "toolCallParser": "qwen"})


def test_cpu_reference_reads_the_images_tokenizer_unless_the_spec_names_one() -> None:
    (container,) = serving_containers(render_slot(deployment("cpu-reference"), Slot.A)).values()
    assert env(container)["LLMOP_TOKENIZER_DIR"] == contract.CPU_REFERENCE_TOKENIZER_DIR
    runtime = {**deployment("cpu-reference").spec.runtime.model_dump(mode="json", by_alias=True),
               "tokenizerUri": "pvc://tokenizers/tiny"}  # fmt: skip
    (own,) = serving_containers(render_slot(deployment("cpu-reference", runtime=runtime), Slot.A)).values()
    assert env(own)["LLMOP_TOKENIZER_DIR"] == f"{contract.TOKENIZER_MOUNT}/tiny"


def test_every_service_clients_use_carries_the_openai_port_to_the_leaders_named_port() -> None:
    """The client Service, the pods' headless one and both revision Services (a canary's, which the
    gateway-api route's backends are)."""
    objs = canary_render()
    service_names = {o["metadata"]["name"] for o in objs if o["kind"] == "Service"}
    assert service_names == {"tiny-llama", "tiny-llama-pods", "tiny-llama-stable", "tiny-llama-canary"}
    for obj in objs:
        if obj["kind"] == "Service":
            ports = {p["name"]: p for p in obj["spec"]["ports"]}
            assert ports["openai"] == OPENAI_PORT


def test_status_endpoints_name_the_openai_base_url_of_the_client_service() -> None:
    assert services.endpoints("tiny-llama", "llm-demo") == {
        "http": "http://tiny-llama.llm-demo.svc:8000",
        "grpc": "tiny-llama.llm-demo.svc:8001",
        "metrics": "http://tiny-llama.llm-demo.svc:8002/metrics",
        "openai": "http://tiny-llama.llm-demo.svc:8080/v1",
    }


GATEWAY = {"trafficRouting": "gateway-api", "gateway": {"parentRefs": [{"name": "gw"}]}}


@pytest.mark.parametrize(
    "rollout",
    [None, {"strategy": "canary", "canary": {"steps": [{"weight": 50}]}},
     {"strategy": "canary", "canary": {"steps": [{"weight": 50}], **GATEWAY}}],
    ids=["rolling", "replica-ratio", "gateway-api"],
)  # fmt: skip
async def test_the_status_says_where_the_openai_api_is_in_every_rollout_mode(
    rollout: dict[str, Any] | None,
) -> None:
    kube, reconciler = await operator_with_nodes()
    body = example("cpu-reference")
    if rollout is not None:
        body["spec"]["rollout"] = rollout
    key = kube.add_deployment(body)
    await reconcile(kube, reconciler, key)
    status = kube.objects[("LLMDeployment", *key)]["status"]
    assert status["endpoints"]["openai"] == f"http://tiny-llama.{NS}.svc:8080/v1"
    service = kube.objects[("Service", NS, "tiny-llama")]
    assert OPENAI_PORT in service["spec"]["ports"]


@pytest.mark.parametrize("alias", ["a,b", "-x", "with space", ""])
def test_an_alias_that_cannot_be_one_served_name_is_refused(alias: str) -> None:
    """Served names travel comma-separated (LLMOP_SERVED_MODEL_NAMES): an alias is one name."""
    with pytest.raises(pydantic.ValidationError, match="alias"):
        ModelSpec.model_validate({"name": "m", "alias": alias, "source": {"uri": "builtin://tiny-llama"}})
