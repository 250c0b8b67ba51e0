"""Engine builds as the cluster shows them, and the per-namespace index of built engines.

An engine is built once per cache key by a Job; when the Job succeeds its key goes into the
namespace's index ConfigMap, so later deployments (and this one, after its Job is gone) serve it
without building again.
"""

from __future__ import annotations

from typing import Any

from llm_operator.controller.kube import KubeApi
from llm_operator.controller.observe import Children
from llm_operator.engine.state import BuildFact, BuildObserved

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


async def record_built(kube: KubeApi, namespace: str, keys: tuple[str, ...], stamp: str) -> None:
    if keys:
        await kube.add_configmap_keys(namespace, ENGINE_INDEX, dict.fromkeys(keys, stamp))
