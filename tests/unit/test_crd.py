"""The committed CRD is exactly what the API models generate, and it is a structural schema."""

from __future__ import annotations

from typing import Any

from llm_operator.api import crd


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        found.append((path, node))
        for key, value in node.items():
            found += _walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _walk(value, f"{path}[{i}]")
    return found


def test_committed_crd_matches_models() -> None:
    assert crd.main(["--check"]) == 0, "crds/ drifted from the API models: run `make crds`"


def test_schema_is_structural() -> None:
    schema = crd.openapi_schema()
    for path, node in _walk(schema):
        assert not {"$ref", "anyOf", "allOf", "oneOf", "title"} & node.keys(), path
        if "properties" in node:
            assert node.get("type") == "object", path
            assert node.get("additionalProperties") is not False, path


def test_scale_and_status_subresources() -> None:
    version = crd.build_crd()["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    expected = {"Model", "TP", "PP", "Replicas", "Ready", "Phase", "Reason", "Canary", "URL", "Age"}
    assert expected <= set(columns)
    assert columns["URL"] == ".status.endpoints.openai", "the OpenAI API's base URL"


def test_every_cel_rule_has_a_human_message() -> None:
    rules = [
        rule for _, node in _walk(crd.openapi_schema()) for rule in node.get("x-kubernetes-validations", [])
    ]
    assert len(rules) >= 20
    for rule in rules:
        assert len(rule["message"]) > 20 and rule["rule"], rule


def test_parallel_degree_is_int_or_string() -> None:
    spec = crd.openapi_schema()["properties"]["spec"]
    tensor = spec["properties"]["parallelism"]["properties"]["tensor"]
    assert tensor["x-kubernetes-int-or-string"] is True
    assert spec["properties"]["parallelism"]["default"] == {"tensor": 1, "pipeline": 1}
