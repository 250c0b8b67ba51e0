"""Engine builds as the cluster shows them, and the per-namespace index of built engines.

An engine is built once per cache key by a Job; when the Job succeeds its key goes into the
namespace's index ConfigMap, so later deployments (and this one, after its Job is gone) serve it
without building again.
"""

from __future__ import annotations

from typing import Any

from lightkube.utils.quantity import parse_quantity

from llm_operator.api.v1alpha1 import LLMDeployment, LLMDeploymentSpec
from llm_operator.controller.cluster.kube import KubeApi
from llm_operator.controller.observe.observe import Children
from llm_operator.engine.sizing import ClaimNeed, gib_quantity
from llm_operator.engine.state import BuildFact, BuildObserved
from llm_operator.plan.types import PlanningError

ENGINE_INDEX = "llm-engine-cache-index"  # per namespace: cache keys whose build Job succeeded


def build_observed(children: Children, namespace: str, key: str, job_name: str) -> BuildObserved:
    index = children.get(("ConfigMap", namespace, ENGINE_INDEX))
    if index is not None and key in (index.get("data") or {}):
        return BuildObserved(BuildFact.RECORDED)
    return job_state(children.get(("Job", namespace, job_name)))


def job_state(job: dict[str, Any] | None) -> BuildObserved:
    if job is None:
        return BuildObserved(BuildFact.ABSENT)
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("status") == "True" and c.get("type") == "Complete":
            return BuildObserved(BuildFact.COMPLETE)
        if c.get("status") == "True" and c.get("type") == "Failed":
            return BuildObserved(BuildFact.FAILED, f"{c.get('reason', '')} {c.get('message', '')}".strip())
    return BuildObserved(BuildFact.RUNNING)


def claims(jobs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(namespace, claim) of every volume claim the build Jobs mount, in order, once."""
    found: dict[tuple[str, str], None] = {}
    for job in jobs:
        for volume in job["spec"]["template"]["spec"].get("volumes", []):
            claim = volume.get("persistentVolumeClaim", {}).get("claimName")
            if claim:
                found[(job["metadata"]["namespace"], claim)] = None
    return list(found)


async def missing_claims(
    kube: KubeApi, jobs: list[dict[str, Any]], known: dict[tuple[str, str], int | None]
) -> list[str]:
    """Claims the builds would mount that do not exist: checked before a build starts, so the
    user reads which claim is missing instead of a Job whose pod stays Pending. Claims once
    seen are remembered with their capacity (`known`), so a running build costs no lookups."""
    missing = []
    for namespace, claim in claims(jobs):
        if (namespace, claim) in known:
            continue
        found = await kube.read_claim(namespace, claim)
        if found is None:
            missing.append(claim)
        else:
            known[(namespace, claim)] = claim_capacity(found)
    return missing


def claim_uris(spec: LLMDeploymentSpec) -> list[str]:
    """The spec's URIs that can name a claim the build Job mounts."""
    calibration = spec.engine.build.calibration if spec.engine.build else None
    return [spec.model.source.uri, spec.engine.cache.uri, *([calibration.dataset_uri] if calibration else [])]


async def claims_problem(
    kube: KubeApi,
    ld: LLMDeployment,
    jobs: list[dict[str, Any]],
    needs: list[ClaimNeed],
    known: dict[tuple[str, str], int | None],
    children: Children,
) -> PlanningError | None:
    """Why the builds cannot start on their claims (VolumeClaimNotFound, CacheTooSmall), or None.
    Sizes are checked for builds not started yet only: a Job that exists runs with the claim it has."""
    missing = await missing_claims(kube, jobs, known)
    if missing:
        uris = claim_uris(ld.spec)
        cache = ld.spec.model.cache.claim_name if ld.spec.model.cache else None  # a field, not a URI
        return PlanningError(
            "VolumeClaimNotFound", missing_claims_message(ld.namespace, missing, uris, cache)
        )
    waiting = [n for n in needs if ("Job", ld.namespace, n.job) not in children]
    return too_small(ld.namespace, waiting, known)


def claim_capacity(claim: dict[str, Any]) -> int | None:
    """Bytes the claim holds: what is bound (status.capacity), else what it asks for; None when it
    says neither."""
    for section, field in (("status", "capacity"), ("spec", "resources")):
        values = (claim.get(section) or {}).get(field) or {}
        storage = (
            (values.get("requests") or {}).get("storage") if field == "resources" else values.get("storage")
        )
        if storage:
            return int(parse_quantity(str(storage)) or 0)
    return None


def too_small(
    namespace: str, needs: list[ClaimNeed], known: dict[tuple[str, str], int | None]
) -> PlanningError | None:
    """CacheTooSmall for the first build whose claim cannot hold it, before its Job exists. A claim
    found too small is forgotten, so the next check reads it again (it may have been expanded)."""
    for need in needs:
        capacity = known.get((namespace, need.claim))
        if capacity is None or capacity >= need.bytes:
            continue
        known.pop((namespace, need.claim), None)
        return PlanningError(
            "CacheTooSmall",
            f'persistentvolumeclaim "{need.claim}" ({need.uri}) holds {gib_quantity(capacity)} and building '
            f"engine {need.key} needs {gib_quantity(need.bytes)} on it (checkpoint, converted "
            "checkpoint and engine; docs/launcher-and-engines.md): expand the claim or point "
            "engine.cache.uri at a larger one (the build starts once it fits)",
        )
    return None


def missing_claims_message(
    namespace: str, missing: list[str], uris: list[str], model_cache: str | None = None
) -> str:
    """The sentence for status: the claims, the namespace, the fields that name them."""
    named = [u for u in uris if any(u.startswith(f"pvc://{c}/") or u == f"pvc://{c}" for c in missing)]
    if model_cache in missing:
        named.append("model.cache.claimName")
    claims_text = ", ".join(f'persistentvolumeclaim "{c}"' for c in missing)
    who = "the model fetch" if named == ["model.cache.claimName"] else "the engine build"
    return (
        f"{claims_text} not found in namespace {namespace}; {who} mounts "
        f"{'them' if len(missing) > 1 else 'it'} for "
        f"{' and '.join(named)}: create the claim or change the URI (the build starts once it exists)"
    )


async def record_built(kube: KubeApi, namespace: str, keys: tuple[str, ...], stamp: str) -> None:
    if keys:
        await kube.add_configmap_keys(namespace, ENGINE_INDEX, dict.fromkeys(keys, stamp))
