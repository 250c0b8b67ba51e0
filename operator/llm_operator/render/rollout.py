"""Objects of a canary rollout (pure): per-revision Services, the HTTPRoute, revision snapshots.

`<name>-stable` and `<name>-canary` select the leaders of one revision, whichever slot runs it, so
promotion only changes a selector. They carry the revision as a label, which the EndpointSlice
controller copies onto their slices: the operator reads there what a gateway can route to. The
HTTPRoute (traffic routing gateway-api) splits by weight between them, Triton's API and the OpenAI
API alike. A ControllerRevision keeps the spec each live revision was started from: the stable slot
is rendered from it while the current spec runs as the canary.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic.alias_generators import to_camel

from llm_operator import labels as L
from llm_operator.api.v1alpha1 import Backend, CpuContract, CpuReferenceSpec, LLMDeployment, LLMDeploymentSpec
from llm_operator.contract import HTTP_PORT, OPENAI_PORT
from llm_operator.images import Images
from llm_operator.render import names, services
from llm_operator.render.children import owned
from llm_operator.render.network import triton_closed
from llm_operator.rollout.revision import NOT_SERVING_IMAGES

GATEWAY_API_VERSION = "gateway.networking.k8s.io/v1"
STABLE, CANARY = "stable", "canary"
SNAPSHOT_COMPONENT = "revision-snapshot"  # our ControllerRevisions only (StatefulSets make others)
REVISION_SERVICE_COMPONENT = "revision-service"  # their EndpointSlices are the only ones watched


def for_slot(ld: LLMDeployment, spec: LLMDeploymentSpec, replicas: int) -> LLMDeployment:
    """`ld` running `spec` at `replicas`: what one slot is planned and rendered from."""
    return ld.model_copy(update={"spec": spec.model_copy(update={"replicas": replicas})})


def revision_services(ld: LLMDeployment, stable: str, canary: str | None) -> list[dict[str, Any]]:
    """`<name>-stable` (and `<name>-canary` while a canary exists): ClusterIP Services over the
    ready leaders of one revision, with the client Service's ports."""
    roles = {STABLE: stable} | ({CANARY: canary} if canary is not None else {})
    return owned(ld, [_revision_service(ld, role, revision) for role, revision in roles.items()])


def _revision_service(ld: LLMDeployment, role: str, revision: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": names.revision_service(ld.name, role),
            "namespace": ld.namespace,
            "labels": {**L.common_labels(ld.name, REVISION_SERVICE_COMPONENT), L.REVISION: revision},
        },
        "spec": {
            "type": "ClusterIP",
            "selector": {**L.selector_labels(ld.name), L.ROLE: "leader", L.REVISION: revision},
            "ports": [dict(p) for p in services.PORTS],
        },
    }


def parent_refs(ld: LLMDeployment) -> list[dict[str, Any]]:
    """spec.rollout.canary.gateway.parentRefs as the Gateway API writes them ([] when unset)."""
    canary = ld.spec.rollout.canary
    gateway = getattr(canary, "gateway", None)
    refs = getattr(gateway, "parent_refs", None) or []
    return [r.model_dump(mode="json", by_alias=True, exclude_none=True) for r in refs]


def http_route(
    ld: LLMDeployment,
    weights: dict[str, int],
    stable: str,
    canary: str | None,
    refs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """HTTPRoute `<name>`: the revision Services as weighted backends, on the HTTP port and, for
    /v1, on the OpenAI port.
    `weights` is {"stable": w, "canary": w}; a backend of weight 0 stays listed (it gets no
    requests). `refs`: the parentRefs, by default those of spec.rollout.canary.gateway. `stable`
    and `canary` are not used in the route itself (the Services select the revisions); they are
    labels, so the route says which revisions it splits between."""
    backends = [_backend(ld, STABLE, weights.get(STABLE, 100))]
    if canary is not None:
        backends.append(_backend(ld, CANARY, weights.get(CANARY, 0)))
    labels = {**L.common_labels(ld.name, "routing"), f"{L.REVISION}-{STABLE}": stable}
    if canary is not None:
        labels[f"{L.REVISION}-{CANARY}"] = canary
    route = {
        "apiVersion": GATEWAY_API_VERSION,
        "kind": "HTTPRoute",
        "metadata": {"name": names.http_route(ld.name), "namespace": ld.namespace, "labels": labels},
        "spec": {
            "parentRefs": parent_refs(ld) if refs is None else [dict(r) for r in refs],
            "rules": [
                # Triton's own API, unless spec.routing.apiKeys closes it to clients.
                *([] if triton_closed(ld) else [{"backendRefs": backends}]),
                # The OpenAI API on its own port, same Services and weights: its longer path prefix
                # wins over the catch-all rule above (HTTPRoute match precedence).
                {
                    "matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
                    "backendRefs": [{**b, "port": OPENAI_PORT} for b in backends],
                },
            ],
        },
    }
    return owned(ld, [route])[0]


def _backend(ld: LLMDeployment, role: str, weight: int) -> dict[str, Any]:
    return {"name": names.revision_service(ld.name, role), "port": HTTP_PORT, "weight": weight}


def controller_revision(
    ld: LLMDeployment, revision: str, number: int, images: Images | None = None
) -> dict[str, Any]:
    """apps/v1 ControllerRevision `<name>-<revision>`: the spec (camelCase, defaults left out, so
    its immutable data stays the same for an operator that adds a defaulted field) and, when
    given, the images the revision was started with. engine.backend and a cpu-reference
    deployment's engine.cpuReference.contract are always written: their defaults have changed once
    (spec_from_snapshot)."""
    spec = ld.spec.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    engine = spec.setdefault("engine", {})
    engine["backend"] = ld.spec.engine.backend.value
    if ld.spec.engine.backend == Backend.CPU_REFERENCE:
        cpu = ld.spec.engine.cpu_reference or CpuReferenceSpec()
        engine.setdefault("cpuReference", {})["contract"] = cpu.contract.value
    data: dict[str, Any] = {"spec": spec}
    if images is not None:
        data["images"] = {
            to_camel(k): v for k, v in dataclasses.asdict(images).items() if k not in NOT_SERVING_IMAGES
        }
    snapshot = {
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": {
            "name": names.controller_revision(ld.name, revision),
            "namespace": ld.namespace,
            "labels": {**L.common_labels(ld.name, SNAPSHOT_COMPONENT), L.REVISION: revision},
        },
        "data": data,
        "revision": number,
    }
    return owned(ld, [snapshot])[0]


def spec_from_snapshot(obj: dict[str, Any]) -> LLMDeploymentSpec:
    """The spec a ControllerRevision keeps; raises pydantic.ValidationError for one this operator
    version cannot read. One without engine.backend, or a cpu-reference one without
    engine.cpuReference.contract, was written while that default was tensorrt-engine (snapshots
    leave defaults out), before pytorch became the default."""
    spec = dict((obj.get("data") or {}).get("spec") or {})
    engine = {"backend": Backend.TENSORRT_ENGINE.value, **(spec.get("engine") or {})}
    if engine["backend"] == Backend.CPU_REFERENCE.value:
        engine["cpuReference"] = {
            "contract": CpuContract.TENSORRT_ENGINE.value,
            **(engine.get("cpuReference") or {}),
        }
    spec["engine"] = engine
    return LLMDeploymentSpec.model_validate(spec)


def images_from_snapshot(obj: dict[str, Any], current: Images | None = None) -> Images | None:
    """The images a ControllerRevision was started with, when it says. A field added to Images
    since (it has a default) may be missing from an older snapshot: the default stands in, but for
    the launcher, which `current`'s stands in for when given: a snapshot written while the operator
    image copied the launcher names no launcher image, and the default repository may be none the
    nodes can pull from (a mirror's)."""
    images = (obj.get("data") or {}).get("images")
    if not isinstance(images, dict):
        return None
    found: dict[str, str] = {}
    for f in dataclasses.fields(Images):
        value = images.get(to_camel(f.name))
        if isinstance(value, str):
            found[f.name] = value
        elif f.default is dataclasses.MISSING:
            return None
    if "launcher" not in found and current is not None:
        found["launcher"] = current.launcher
    return Images(**found)
