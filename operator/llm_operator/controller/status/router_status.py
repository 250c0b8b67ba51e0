"""routing.mode inference-pool in status: what the router Deployment and the InferencePool API
show (observe, from the watch cache), and what the conditions then say (pure).

The router carries only the traffic sent to `<name>-router`: the client Service keeps serving
whatever the router does, so a router that is down is Degraded, not a stopped deployment. The
InferencePool kind missing from the cluster stalls the deployment (the user must install the CRDs);
everything else, the router included, is applied all the same and keeps running.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from llm_operator.api.v1alpha1 import FailureMode, LLMDeployment, Phase, RoutingMode
from llm_operator.controller.status.conditions import cond, stalled
from llm_operator.render import names

ObjKey = tuple[str, str, str]  # kind, namespace, name (controller/cluster/kube.py)

CONDITION = "PickerReady"
POOL_API = "inference.networking.k8s.io/v1"
POOL_CRD_MISSING = "InferencePoolCrdMissing"
PICKER_UNAVAILABLE = "PickerUnavailable"
# What to install when the API server does not serve InferencePool (answers 404 for its path).
INSTALL_CRDS = (
    "install the Gateway API Inference Extension v1 CRDs (kubectl apply -f https://github.com/"
    "kubernetes-sigs/gateway-api-inference-extension/releases/download/v1.5.0/manifests.yaml), "
    "or set routing.mode service"
)


@dataclass(frozen=True)
class RouterObserved:
    failure_mode: FailureMode
    router: str  # the Deployment's name
    available: bool = False
    why: str = ""  # the Deployment's own words while it is not available
    pool_api_missing: bool = False
    api_words: str = ""  # the API server's answer to the InferencePool's apply, when it was refused


def observe(
    children: Mapping[ObjKey, dict[str, Any]], ld: LLMDeployment, missing_apis: set[str], api_words: str = ""
) -> RouterObserved | None:
    """None in routing.mode service. `api_words`: what the API server answered the InferencePool's
    apply when it does not serve the kind."""
    if ld.spec.routing.mode != RoutingMode.INFERENCE_POOL:
        return None
    name = names.router(ld.name)
    missing = "InferencePool" in missing_apis
    seen = RouterObserved(ld.spec.routing.failure_mode, name, pool_api_missing=missing, api_words=api_words)
    deployment = children.get(("Deployment", ld.namespace, name))
    if deployment is None:
        return replace(seen, why="not created yet")
    status = deployment.get("status") or {}
    conds = {c.get("type"): c for c in status.get("conditions") or []}
    current = status.get("observedGeneration", 0) >= deployment["metadata"].get("generation", 0)
    if current and conds.get("Available", {}).get("status") == "True" and status.get("readyReplicas", 0) > 0:
        return replace(seen, available=True)
    failing = [c for t in ("ReplicaFailure", "Progressing", "Available") if (c := conds.get(t))]
    why = next((c.get("message", "") for c in failing if c.get("status") != "True" and c.get("message")), "")
    return replace(seen, why=why or "its pod is not ready yet")


def unavailable_message(r: RouterObserved) -> str:
    if r.failure_mode == FailureMode.FAIL_OPEN:
        effect = (
            "routing.picker.failureMode FailOpen: requests to the router still reach ready replicas, "
            "through the client Service without picking"
        )
    else:
        effect = (
            "routing.picker.failureMode FailClose: requests to the router fail until it is ready "
            "(its Envoy answers 503)"
        )
    return f"router {r.router} is not available ({r.why}); {effect}"


def adjust(
    router: RouterObserved | None,
    conds: list[dict[str, Any]],
    phase: Phase,
    reason: str,
    message: str,
    serving: bool,
    g: int,
) -> tuple[list[dict[str, Any]], Phase, str, str]:
    """The conditions with the router's state: PickerReady always (inference-pool mode); a missing
    InferencePool API stalls; an unavailable router makes a Ready deployment Degraded."""
    if router is None:
        return conds, phase, reason, message
    if router.pool_api_missing:
        answer = f" (it answered the InferencePool's apply: {router.api_words})" if router.api_words else ""
        why = f"the API server does not serve InferencePool ({POOL_API}){answer}: {INSTALL_CRDS}"
        picker = cond(CONDITION, False, POOL_CRD_MISSING, why, g)
        stalled_conds, stalled_phase = stalled(POOL_CRD_MISSING, why, serving, g)
        types = {c["type"] for c in stalled_conds}
        return (
            [*stalled_conds, *(c for c in conds if c["type"] not in types), picker],
            stalled_phase,
            POOL_CRD_MISSING,
            why,
        )
    if router.available:
        return [*conds, cond(CONDITION, True, "PickerAvailable", "", g)], phase, reason, message
    why = unavailable_message(router)
    picker = cond(CONDITION, False, PICKER_UNAVAILABLE, why, g)
    if any(c["type"] == "Stalled" and c["status"] == "True" for c in conds):
        return [*conds, picker], phase, reason, message  # what stalls says more
    ready = next((c for c in conds if c["type"] == "Ready"), None)
    if ready is None or ready["status"] != "True":
        return [*conds, picker], phase, reason, message  # still coming up: that reason stands
    replaced = {
        "Ready": cond("Ready", False, PICKER_UNAVAILABLE, why, g),
        "Degraded": cond("Degraded", True, PICKER_UNAVAILABLE, why, g),
    }
    adjusted = [replaced.get(c["type"], c) for c in conds]
    return [*adjusted, picker], Phase.DEGRADED, PICKER_UNAVAILABLE, why
