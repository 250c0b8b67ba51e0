"""revision_of: what serves changes the revision; scale and rollout settings do not."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator.api.v1alpha1 import LLMDeploymentSpec, RuntimeSpec
from llm_operator.images import Images
from llm_operator.rollout.revision import revision_of

REPO = Path(__file__).resolve().parents[2]
# The launcher named, not defaulted: the default's tag is the content hash of the injected files.
IMAGES = Images("runtime:1", "cpu-runtime:1", "builder:1", "0.17.0", launcher="launcher:1")


def spec(**changes: Any) -> LLMDeploymentSpec:
    doc = yaml.safe_load((REPO / "examples" / "llama3-8b-h100.yaml").read_text())["spec"]
    for path, value in changes.items():
        node = doc
        *parents, leaf = path.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return LLMDeploymentSpec.model_validate(doc)


BASE = revision_of(spec(), IMAGES)
# The pinned revisions below moved once, with every revision, when the launcher image (named by its
# content) replaced the operator's image in the hash: that upgrade rolls each deployment once
# (docs/upgrading.md); the defaults' flips they guard rolled nothing before it or after.


def test_revision_is_ten_hex_characters_and_stable() -> None:
    assert len(BASE) == 10 and int(BASE, 16) >= 0
    assert revision_of(spec(), IMAGES) == BASE


@pytest.mark.parametrize(
    "changes",
    [
        {"model__source__uri": "s3://models/llama3-8b-instruct-v2/"},
        {"engine__maxBatchSize": 32},
        {"engine__precision": "fp16"},
        {"runtime__env": [{"name": "X", "value": "1"}]},
        {"runtime__image": "my/triton:2"},
        {"runtime__podLabels": {"team": "a"}},
        {"resources__memory": "99Gi"},
    ],
)
def test_what_serves_changes_the_revision(changes: dict[str, Any]) -> None:
    assert revision_of(spec(**changes), IMAGES) != BASE


@pytest.mark.parametrize(
    "images",
    [
        dataclasses.replace(IMAGES, runtime="runtime:2"),
        dataclasses.replace(IMAGES, engine_builder="builder:2"),
        dataclasses.replace(IMAGES, trtllm_version="0.18.0"),
        dataclasses.replace(IMAGES, launcher="launcher:2"),  # another content hash: other code runs
    ],
)
def test_the_operators_images_change_the_revision(images: Images) -> None:
    assert revision_of(spec(), images) != BASE


@pytest.mark.parametrize(
    "changes",
    [
        {"replicas": 7},
        {"autoscaling": {"minReplicas": 1, "maxReplicas": 4}},
        {"rollout": {"strategy": "rolling"}},
        {"runtime__exitTimeoutSeconds": RuntimeSpec().exit_timeout_seconds},  # a default written out
    ],
)
def test_scale_and_rollout_settings_do_not(changes: dict[str, Any]) -> None:
    assert revision_of(spec(**changes), IMAGES) == BASE


def test_a_snapshot_round_trip_keeps_the_revision() -> None:
    original = spec(engine__maxBatchSize=16)
    stored = original.model_dump(mode="json", by_alias=True)
    assert revision_of(LLMDeploymentSpec.model_validate(stored), IMAGES) == revision_of(original, IMAGES)


def test_the_ttft_budget_is_part_of_the_revision_as_the_pods_see_it() -> None:
    """Its bucket edge is in the model repository: a new budget is a new revision (a canary), not
    a silent restart of the stable pods."""

    def canary(budget: int) -> dict[str, Any]:
        analysis = {"prometheus": {"url": "http://p:9090"}, "maxTimeToFirstTokenMilliseconds": budget}
        return {"strategy": "canary", "canary": {"steps": [{"weight": 10}], "analysis": analysis}}

    assert revision_of(spec(rollout=canary(1000)), IMAGES) != revision_of(spec(rollout=canary(500)), IMAGES)


@pytest.mark.parametrize(
    ("backend", "revisions"),
    [("tensorrt-engine", ("5ef0f87445", "68ccab3545")), ("pytorch", ("2c5a0bdf74", "d94b861292"))],
)
def test_the_pytorch_default_makes_no_deployment_a_new_revision(
    backend: str, revisions: tuple[str, ...]
) -> None:
    """The revisions an operator computed while engine.backend defaulted to tensorrt-engine (pinned
    from it, then moved once with every revision: the note at BASE): a deployment of either backend
    keeps its revision, so the new default rolls nothing."""
    model = {"name": "m", "source": {"uri": "pvc://models/m"}}
    engines = [{"backend": backend}, {"backend": backend, "maxBatchSize": 8}]
    got = tuple(
        revision_of(LLMDeploymentSpec.model_validate({"model": model, "engine": e}), IMAGES) for e in engines
    )
    assert got == revisions


@pytest.mark.parametrize(
    ("cpu_reference", "revisions"),
    [
        ({"contract": "tensorrt-engine"}, ("0732cc73e8", "7a8553968d")),
        ({"contract": "pytorch"}, ("13704a00e6", "3af2cd7d0d")),
    ],
)
def test_the_pytorch_contract_default_makes_no_stored_cpu_deployment_a_new_revision(
    cpu_reference: dict[str, str], revisions: tuple[str, ...]
) -> None:
    """The revisions an operator computed while engine.cpuReference.contract defaulted to
    tensorrt-engine (pinned from it, the note at BASE) for the objects the API server stored then:
    it writes the contract's default into every engine.cpuReference at creation, so each keeps its
    revision."""
    model = {"name": "m", "source": {"uri": "builtin://tiny-llama"}}
    engine = {"backend": "cpu-reference", "cpuReference": cpu_reference}
    engines = [engine, {**engine, "maxBatchSize": 4}]
    got = tuple(
        revision_of(LLMDeploymentSpec.model_validate({"model": model, "engine": e}), IMAGES) for e in engines
    )
    assert got == revisions


def test_a_cpu_deployment_without_cpu_reference_is_the_pytorch_contract_and_hashes_as_it() -> None:
    """No engine.cpuReference: the default contract, pytorch, the same revision as naming it (and
    no longer the one it had while it spoke the ensemble, 9a9190d14a: docs/upgrading.md)."""
    model = {"name": "m", "source": {"uri": "builtin://tiny-llama"}}

    def revision(engine: dict[str, Any]) -> str:
        return revision_of(LLMDeploymentSpec.model_validate({"model": model, "engine": engine}), IMAGES)

    bare = revision({"backend": "cpu-reference"})
    assert bare == revision({"backend": "cpu-reference", "cpuReference": {"contract": "pytorch"}})
    assert bare == revision({"backend": "cpu-reference", "cpuReference": {}}) == "13704a00e6"
