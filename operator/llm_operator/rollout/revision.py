"""Revisions and slots: what identifies the thing that serves, and where it runs.

A revision is a hash of everything that changes what serves (the spec without its scale and
rollout fields, plus the operator's images); a slot (`a` or `b`) is the set of serving objects a
revision runs in. A revision never moves slot, so promoting a canary restarts no pod.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from llm_operator.api.v1alpha1 import Backend, CpuContract, CpuReferenceSpec, LLMDeploymentSpec, Slot
from llm_operator.images import Images
from llm_operator.modelrepo import ttft_budget_ms

# Fields that say how much, how to roll out or who may connect, not what serves: editing them is no
# new revision.
NOT_SERVING = frozenset({"replicas", "autoscaling", "rollout", "network_policy", "routing"})
# Not what serving pods run: the router's images (routing.mode inference-pool; its waker at
# minReplicas 0) run beside them.
NOT_SERVING_IMAGES = frozenset({"picker", "envoy", "waker"})
__all__ = ["NOT_SERVING", "Slot", "revision_of"]


def revision_of(spec: LLMDeploymentSpec, images: Images) -> str:
    """10 hex characters of sha256 over the canonical JSON of what serves.

    Fields left at their defaults are left out, so an operator version that adds a defaulted
    field does not make every deployment a new revision (nor restart its pods). The one rollout
    field the pods see, the TTFT budget (a histogram bucket edge in the model repository), is in, and
    so is the one routing field they see, the API keys' Secret (the leaders mount it; the keys in
    it change without a new revision)."""
    serving = spec.model_dump(mode="json", by_alias=True, exclude_defaults=True, exclude=set(NOT_SERVING))
    _as_first_defaulted(serving, spec)
    if spec.routing.api_keys is not None:
        serving["apiKeysSecret"] = spec.routing.api_keys.secret_ref.name
    budget = ttft_budget_ms(spec)
    if budget is not None:
        serving["ttftBudgetMilliseconds"] = budget
    pods = {k: v for k, v in dataclasses.asdict(images).items() if k not in NOT_SERVING_IMAGES}
    # The multi-node image of operators before its removal, hashed as unset (the chart's default),
    # so that removal makes no deployment of an operator that left it unset a new revision.
    pods["multi_node_runtime"] = ""
    canonical = json.dumps({"spec": serving, "images": pods}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:10]


def _as_first_defaulted(serving: dict[str, Any], spec: LLMDeploymentSpec) -> None:
    """engine.backend and engine.cpuReference.contract are hashed as when each defaulted to
    tensorrt-engine (until pytorch became their default): left out for tensorrt-engine, in for the
    others, so the new defaults make no deployment that names them, as every stored one does (the
    CRD writes defaults at creation), a new revision. A cpu-reference deployment without
    engine.cpuReference speaks the pytorch contract now, and hashes as one that names it."""
    engine = serving.setdefault("engine", {})
    backend = spec.engine.backend
    if backend == Backend.TENSORRT_ENGINE:
        engine.pop("backend", None)
    else:
        engine["backend"] = backend.value
    if backend == Backend.CPU_REFERENCE:
        cpu = engine.setdefault("cpuReference", {})
        contract = (spec.engine.cpu_reference or CpuReferenceSpec()).contract
        if contract == CpuContract.TENSORRT_ENGINE:
            cpu.pop("contract", None)
        else:
            cpu["contract"] = contract.value
    if not engine:
        del serving["engine"]
