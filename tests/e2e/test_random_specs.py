"""Random specs against the real API server: every spec it accepts either yields children it
accepts too, or a Stalled condition with a reason; nothing ends in a traceback.

The first test walks the operator's own pure path (plan, desired) for many specs and server-side
dry-runs every child; the second hands a few accepted specs to the running operator.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from llm_operator.api.v1alpha1 import LLMDeployment
from llm_operator.controller.config import OperatorConfig
from llm_operator.desired import desired, plan_for
from llm_operator.engine.state import BuildFact, BuildObserved, ModelFact, ModelObserved
from llm_operator.plan.inventory import Inventory
from llm_operator.plan.types import PlanningError
from pydantic import ValidationError

from e2e.cluster.testing import Kubectl, KubectlError, condition, wait_for
from tests.e2e.operator_fixtures import OperatorProcess
from tests.e2e.spec_strategies import specs
from tests.unit.model_cache_fixtures import CACHED

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.own_operator,  # reads its operator's own log
    pytest.mark.usefixtures("gpu_pools"),
]
CAMEL_CASE = re.compile(r"^[A-Z][A-Za-z0-9]+$")
# What the API server says when it refuses a manifest: the field and why, never an internal error.
REFUSAL = re.compile(r"is invalid|Invalid value|Unsupported value|Required value|Too long|must be")
_names = itertools.count()
RANDOM = settings(deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def body(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "llmoperator.io/v1alpha1",
        "kind": "LLMDeployment",
        "metadata": {"name": f"random-{next(_names)}"},
        "spec": spec,
    }


def admitted(kubectl: Kubectl, namespace: str, spec: dict[str, Any]) -> dict[str, Any] | None:
    """The object as the API server would store it, or None when admission refuses it (with words)."""
    try:
        stored: dict[str, Any] = kubectl.json(
            "create", "--dry-run=server", "-f", "-", namespace=namespace, input=json.dumps(body(spec))
        )
        return stored
    except KubectlError as e:
        refusal = e.stderr
    assert REFUSAL.search(refusal) and "Internal error" not in refusal, f"refused without why: {refusal}"
    return None


@pytest.fixture(scope="module")
def inventory(kubectl: Kubectl) -> Inventory:
    found = Inventory()
    for node in kubectl.items("nodes"):
        found.upsert(node)
    return found


@settings(RANDOM, max_examples=60)
@given(spec=specs())
def test_every_accepted_spec_yields_children_the_api_server_accepts_or_a_reason(
    spec: dict[str, Any], crd: None, kubectl: Kubectl, namespace: str, inventory: Inventory
) -> None:
    stored = admitted(kubectl, namespace, spec)
    if stored is None:
        event("refused at admission")
        return
    try:
        ld = LLMDeployment.model_validate(stored)
    except ValidationError as e:  # the operator reports this as Stalled InvalidSpec
        pytest.fail(f"the API server accepted what the operator's models refuse:\n{spec}\n{e}")
    images = OperatorConfig.from_env().images
    children: list[dict[str, Any]] = []
    refused: PlanningError | None = None
    try:
        plan = plan_for(ld, inventory)
        for fact in (BuildFact.ABSENT, BuildFact.RECORDED):
            # The model: not fetched yet (its fetch Job), then in the cache (what serves it).
            model = ModelObserved(ModelFact.ABSENT) if fact == BuildFact.ABSENT else CACHED
            want = desired(
                ld, plan, images, lambda *_, fact=fact: BuildObserved(fact), models=lambda *_, m=model: m
            )
            children += want.jobs if fact == BuildFact.ABSENT else want.shared + want.children
    except PlanningError as e:  # becomes Stalled with this reason and sentence
        refused = e
    if refused is not None:
        event(f"Stalled {refused.reason}")
        assert CAMEL_CASE.match(refused.reason) and refused.message, (refused.reason, refused.message)
        return
    event(f"{len(children)} children accepted")
    assert children, f"nothing to apply for an accepted, placeable spec: {spec}"
    items = json.dumps({"apiVersion": "v1", "kind": "List", "items": children})
    try:
        kubectl(
            "apply", "--server-side", "--dry-run=server", "--field-manager=llm-operator", "-f", "-",
            namespace=namespace, input=items,
        )  # fmt: skip
    except KubectlError as e:
        pytest.fail(f"the API server refuses a child of an accepted spec:\n{spec}\n{e.stderr}")


@settings(RANDOM, max_examples=10)
@given(spec=specs())
def test_the_operator_answers_every_accepted_spec_with_a_condition(
    spec: dict[str, Any], kubectl: Kubectl, namespace: str, operator_process: OperatorProcess
) -> None:
    if admitted(kubectl, namespace, spec) is None:
        return
    (created,) = kubectl.apply(body(spec), namespace)
    name = created["metadata"]["name"]
    answered = wait_for(
        f"{name} answered for its generation",
        lambda: kubectl.get("llmdeployment", name, namespace),
        lambda o: (
            o is not None
            and (o.get("status") or {}).get("observedGeneration") == o["metadata"]["generation"]
            and condition(o, "Ready") is not None
        ),
        timeout=60,
    )
    assert answered is not None
    stalled = condition(answered, "Stalled") or {}
    event(f"Stalled {stalled.get('reason')}" if stalled.get("status") == "True" else "not stalled")
    if stalled.get("status") == "True":
        assert CAMEL_CASE.match(stalled["reason"]) and stalled["message"], stalled
    kubectl.delete("llmdeployment", name, namespace)
    assert "Traceback" not in operator_process.log(), operator_process.log()[-3000:]
