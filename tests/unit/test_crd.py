"""The committed CRD is exactly what the API models generate, and it is a structural schema."""

from __future__ import annotations

from typing import Any

from llm_operator.api import crd
from llm_operator.api import v1alpha1 as api


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


def _properties(node: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    """Every property under node with its path, through list items and map values."""
    found: list[tuple[str, dict[str, Any]]] = []
    for name, prop in node.get("properties", {}).items():
        found += [(f"{path}.{name}", prop), *_properties(prop, f"{path}.{name}")]
    for key, suffix in (("items", "[]"), ("additionalProperties", "{}")):
        if isinstance(node.get(key), dict):
            found += _properties(node[key], path + suffix)
    return found


def test_every_field_is_described() -> None:
    # `kubectl explain` shows a field's description, or <empty>: a new field must say what it means.
    schema = crd.openapi_schema()["properties"]
    fields = [(root, schema[root]) for root in ("spec", "status")]
    fields += [found for root, node in list(fields) for found in _properties(node, root)]
    assert len(fields) > 250
    undescribed = [path for path, node in fields if not str(node.get("description", "")).strip()]
    assert not undescribed, f"fields without a description: {', '.join(undescribed)}"


def test_a_field_of_a_documented_class_carries_the_docstring_and_its_own_description() -> None:
    spec = crd.openapi_schema()["properties"]["spec"]
    architecture = spec["properties"]["model"]["properties"]["architecture"]
    docstring = " ".join((api.ModelArchitecture.__doc__ or "").split())
    own = api.ModelSpec.model_fields["architecture"].description
    assert docstring and own
    assert architecture["description"] == f"{docstring} {own}"
    # Without a description of its own, the field is described by its class's docstring alone.
    assert spec["properties"]["model"]["description"] == " ".join((api.ModelSpec.__doc__ or "").split())


def test_descriptions_are_one_line() -> None:
    # Docstrings wrap at the source's line length; the wraps are not the API's words.
    for path, node in _walk(crd.openapi_schema()):
        assert "\n" not in str(node.get("description", "")), path
