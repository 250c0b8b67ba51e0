"""Generates the LLMDeployment CRD from the pydantic models (the models are the single source).

`python -m llm_operator.api.crd --write` (make crds) rewrites crds/ and the chart's copy;
`--check` exits non-zero when the committed files differ from what the models produce.
pydantic emits JSON Schema with $refs, anyOf-null for optional fields and titles; Kubernetes wants
a structural schema, so refs are inlined, optionals become plain (non-required) properties, and
list semantics (map/set) are declared where the API needs them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel

from llm_operator.api import v1alpha1 as api

REPO_ROOT = Path(__file__).resolve().parents[3]
CRD_FILE = f"{api.PLURAL}.{api.GROUP}.yaml"
CRD_PATHS = [REPO_ROOT / "crds" / CRD_FILE, REPO_ROOT / "charts" / "llm-operator" / "crds" / CRD_FILE]

# Lists whose identity is a key (merge by key in server-side apply) or a set of scalars.
LIST_TYPES: dict[tuple[str, ...], dict[str, Any]] = {
    ("spec", "resources", "gpu", "pools"): {
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["name"],
    },
    ("spec", "resources", "gpu", "products"): {"x-kubernetes-list-type": "set"},
    ("status", "conditions"): {
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
    },
}

PRINTER_COLUMNS = [
    {"name": "Model", "type": "string", "jsonPath": ".spec.model.name"},
    {"name": "TP", "type": "integer", "jsonPath": ".status.placement.tensorParallelism"},
    {"name": "PP", "type": "integer", "jsonPath": ".status.placement.pipelineParallelism"},
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Reason", "type": "string", "jsonPath": ".status.reason"},
    {"name": "Canary", "type": "integer", "jsonPath": ".status.revisions.canaryWeight"},
    # The OpenAI API's base URL, as KServe shows an InferenceService's URL.
    {"name": "URL", "type": "string", "jsonPath": ".status.endpoints.openai"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "GPU", "type": "string", "jsonPath": ".status.placement.gpuProduct", "priority": 1},
    {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
    # Seconds from the last new pod's creation to Ready (status.lastColdStart).
    {"name": "ColdStart", "type": "integer", "jsonPath": ".status.lastColdStart.totalSeconds", "priority": 1},
]

_DROP_KEYS = {"title", "$defs"}


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    """Inline refs and rewrite pydantic's JSON Schema into a Kubernetes structural schema."""
    if isinstance(node, list):
        return [_structural(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        extras = {k: v for k, v in node.items() if k != "$ref"}
        merged = {**target, **extras}
        if "description" in target and "description" in extras:
            # The class docstring says what the object is, the field's description what it is for
            # here: kubectl explain shows the field's node only, so it carries both.
            merged["description"] = f"{target['description']} {extras['description']}"
        return _structural(merged, defs)
    any_of = node.get("anyOf")
    if any_of is not None:
        non_null = [s for s in any_of if s.get("type") != "null"]
        if len(non_null) == 1:  # Optional[X]: absence is the null; keep X and the outer extras
            rest = {k: v for k, v in node.items() if k != "anyOf"}
            return _structural({**non_null[0], **rest}, defs)
        raise ValueError(f"unsupported union in the API schema: {any_of}")
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP_KEYS:
            continue
        if key == "default" and value is None:
            continue
        if key == "additionalProperties" and value is False:
            continue  # extra=forbid: the API server prunes unknown fields anyway
        if key == "properties":
            out[key] = {name: _structural(prop, defs) for name, prop in value.items()}
        elif key == "description" and isinstance(value, str):
            out[key] = " ".join(value.split())  # docstrings wrap at the source's line length
        else:
            out[key] = _structural(value, defs)
    if "properties" in out and "type" not in out:
        out["type"] = "object"
    return out


def _apply_list_types(schema: dict[str, Any]) -> None:
    for path, extra in LIST_TYPES.items():
        node = schema
        for part in path:
            node = node["properties"][part]
        node.update(extra)


def _model_classes(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [c for arg in get_args(annotation) for c in _model_classes(arg)]


def _object_defaults(model: type[BaseModel], schema: dict[str, Any]) -> None:
    """Sub-objects the models default (default_factory) are defaulted by the API server too, so
    stored objects are explicit and CEL rules never meet a missing object."""
    for name, field in model.model_fields.items():
        prop = schema.get("properties", {}).get(field.alias or name)
        if prop is None:
            continue
        default = field.default_factory() if field.default_factory is not None else None  # type: ignore[call-arg]
        if isinstance(default, BaseModel):
            # The whole default object: the API server validates a default against the CEL rules
            # as written, without first defaulting inside it.
            prop["default"] = default.model_dump(mode="json", by_alias=True, exclude_none=True)
        for cls in _model_classes(field.annotation):
            target = prop.get("items", prop) if prop.get("type") == "array" else prop
            _object_defaults(cls, target)


def _model_schema(model: type[api.Spec]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    structural = _structural(raw, raw.get("$defs", {}))
    assert isinstance(structural, dict)
    _object_defaults(model, structural)
    return structural


def openapi_schema() -> dict[str, Any]:
    spec = _model_schema(api.LLMDeploymentSpec)
    status = _model_schema(api.LLMDeploymentStatus)
    schema: dict[str, Any] = {
        "type": "object",
        "description": "LLMDeployment serves one LLM on Triton + TensorRT-LLM.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            # A status from creation on: kstatus (Flux, Helm 4 --wait) reads an object without
            # conditions as Current; observedGeneration 0 reads InProgress until the operator writes.
            "status": {**status, "default": {"observedGeneration": 0}},
        },
    }
    _apply_list_types(schema)
    return schema


def build_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{api.PLURAL}.{api.GROUP}",
            "labels": {"app.kubernetes.io/name": "llm-operator", "app.kubernetes.io/component": "crd"},
        },
        "spec": {
            "group": api.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": api.KIND,
                "listKind": f"{api.KIND}List",
                "plural": api.PLURAL,
                "singular": api.SINGULAR,
                "shortNames": api.SHORT_NAMES,
                "categories": ["all", "llm"],
            },
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


def render() -> str:
    header = "# Generated from operator/llm_operator/api/v1alpha1.py by `make crds`. Do not edit.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite the committed CRD files")
    mode.add_argument("--check", action="store_true", help="fail if the committed files drifted")
    args = parser.parse_args(argv)
    text = render()
    stale = [p for p in CRD_PATHS if not p.exists() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"{p.relative_to(REPO_ROOT)} is stale: run `make crds`", file=sys.stderr)
        return 1 if stale else 0
    for p in stale:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        print(f"wrote {p.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
