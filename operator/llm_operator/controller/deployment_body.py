"""The LLMDeployment object as the reconcile reads it (pure): what of it is kept between passes,
whether a watch event changed anything, its conditions, and why its spec does not validate."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

# Written by kubectl's client-side apply: the whole spec again, as a string the operator never reads.
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def kept_of_deployment(body: dict[str, Any]) -> dict[str, Any]:
    """What the reconcile reads of an LLMDeployment: not who wrote which field (managedFields, half
    of a converged object) nor client-side apply's copy of the spec."""
    meta = {k: v for k, v in body["metadata"].items() if k != "managedFields"}
    if LAST_APPLIED in meta.get("annotations", {}):
        meta["annotations"] = {k: v for k, v in meta["annotations"].items() if k != LAST_APPLIED}
    return {**body, "metadata": meta}


def without_version(body: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in body["metadata"].items() if k != "resourceVersion"}
    return {**body, "metadata": meta}


def condition_status(status: dict[str, Any], type_: str) -> str | None:
    for c in status.get("conditions", []):
        if c.get("type") == type_:
            return str(c.get("status"))
    return None


def first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']}"
