"""The model cache as the cluster shows it: the namespace's index of fetched models, the fetch
Jobs and their pods (render/model_fetch.py renders the Jobs; llm_operator/modelcache/ runs in them).

A fetch Job's result is its pod's termination message (one JSON object: the resolved revision,
directory, bytes and files, or the fetcher's failure reason and message). While it runs, status
names the Job and when it started; its byte progress is in its log, which the operator does not
read (that would take `pods/log` on every pod of the cluster): `kubectl logs job/<Job>` shows it
with the user's own rights. A finished fetch goes into the
namespace's `llm-model-cache-index` ConfigMap, so later deployments of the same claim, source and
revision start no Job. A failed fetch is tried again every RETRY_SECONDS while the spec stays the
same (its Job is deleted; the next pass creates it again), so a fixed Secret heals by itself.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from llm_operator import labels as L
from llm_operator.api.v1alpha1 import LLMDeployment
from llm_operator.controller.cluster.kube import KubeApi
from llm_operator.controller.observe.engines import job_state
from llm_operator.controller.observe.observe import Children, Key
from llm_operator.controller.status.model_status import RETRY_SECONDS
from llm_operator.desired import Desired
from llm_operator.engine.state import BuildFact, ModelFact, ModelObserved, ModelState
from llm_operator.render import names
from llm_operator.render.model_fetch import MODEL_INDEX, model_request

log = logging.getLogger(__name__)

JOB_NAME_LABEL = "batch.kubernetes.io/job-name"  # set by the Job controller on its pods
COMPONENT = "model-fetch"


@dataclass(frozen=True)
class FetchPod:
    """What the operator keeps of a fetch Job's newest pod."""

    name: str
    created: str
    phase: str
    message: str = ""  # the fetch container's termination message


class FetchPods:
    """The newest pod of each fetch Job, kept from the pod watch (fetch pods carry the
    operator's labels): no list request per reconcile."""

    def __init__(self) -> None:
        self._pods: dict[tuple[str, str], FetchPod] = {}

    def update(self, event: str, pod: dict[str, Any]) -> Key | None:
        """Record the pod; the owning deployment when that changed anything."""
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        job = labels.get(JOB_NAME_LABEL) or labels.get("job-name")
        if labels.get(L.COMPONENT) != COMPONENT or not job or not labels.get(L.DEPLOYMENT):
            return None
        key = (meta.get("namespace", ""), job)
        before = self._pods.get(key)
        if event == "DELETED":
            if before is None or before.name != meta.get("name"):
                return None
            del self._pods[key]
        else:
            seen = fetch_pod(pod)
            if before is not None and (before.created, before.name) > (seen.created, seen.name):
                return None  # an older attempt's late event
            if before == seen:
                return None
            self._pods[key] = seen
        return (meta.get("namespace", ""), labels[L.DEPLOYMENT])

    def of(self, namespace: str, job: str) -> FetchPod | None:
        return self._pods.get((namespace, job))

    def forget_job(self, namespace: str, job: str) -> None:
        self._pods.pop((namespace, job), None)


def fetch_pod(pod: dict[str, Any]) -> FetchPod:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    message = ""
    for c in status.get("containerStatuses") or []:
        ended = (c.get("state") or {}).get("terminated") or {}
        if c.get("name") == "fetch" and ended:
            message = ended.get("message") or ""
    return FetchPod(meta.get("name", ""), meta.get("creationTimestamp", ""), status.get("phase", ""), message)


def termination(message: str) -> dict[str, Any] | None:
    """The fetcher's result: its one JSON object, or None (no message, or not the fetcher's)."""
    try:
        result = json.loads(message)
    except ValueError:
        return None
    return result if isinstance(result, dict) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def indexed(entry: str) -> ModelObserved | None:
    """An index entry (desired.index_value wrote it); None when unreadable (then fetched again)."""
    found = termination(entry)
    if found is None or not isinstance(found.get("directory"), str) or not found["directory"]:
        return None
    return ModelObserved(
        ModelFact.RECORDED,
        directory=found["directory"],
        resolved_revision=str(found.get("resolvedRevision") or ""),
        bytes=_int(found.get("bytes")),
        total_bytes=_int(found.get("bytes")),
        files=_int(found.get("files")),
        total_files=_int(found.get("files")),
    )


def observed(
    index: dict[str, Any] | None,
    job: dict[str, Any] | None,
    pod: FetchPod | None,
    key: str,
) -> ModelObserved:
    """What the cluster shows for one fetch key: the index, else the Job and its newest pod."""
    entry = ((index or {}).get("data") or {}).get(key)
    if entry is not None and (recorded := indexed(entry)) is not None:
        return recorded
    build = job_state(job)
    result = termination(pod.message) if pod is not None else None
    if build.fact == BuildFact.ABSENT:
        return ModelObserved(ModelFact.ABSENT)
    if build.fact == BuildFact.COMPLETE:
        if result is None or not isinstance(result.get("directory"), str):
            return ModelObserved(
                ModelFact.FAILED,
                reason="FetchResultMissing",
                message="the fetch Job succeeded but its pod's termination message (the fetched "
                "directory) is gone: the model is fetched again (a cache hit, nothing downloaded)",
            )
        total = _int(result.get("bytes"))
        return ModelObserved(
            ModelFact.COMPLETE,
            directory=result["directory"],
            resolved_revision=str(result.get("resolvedRevision") or ""),
            bytes=total,
            total_bytes=total,
            files=_int(result.get("files")),
            total_files=_int(result.get("files")),
        )
    if build.fact == BuildFact.FAILED:
        if result is not None and isinstance(result.get("reason"), str) and result["reason"]:
            message = str(result.get("message") or "")
            field = result.get("field")
            if isinstance(field, str) and field and field not in message:
                message = f"{message} (fix {field})" if message else f"fix {field}"
            return ModelObserved(ModelFact.FAILED, reason=result["reason"], message=message)
        return ModelObserved(ModelFact.FAILED, reason="FetchFailed", message=f"fetch Job: {build.message}")
    started = ((job or {}).get("status") or {}).get("startTime")
    return ModelObserved(ModelFact.RUNNING, started=started if isinstance(started, str) else "")


def failed_at(job: dict[str, Any] | None) -> str | None:
    for c in ((job or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == "Failed" and c.get("status") == "True":
            return str(c.get("lastTransitionTime") or "") or None
    return None


def retry_in(job: dict[str, Any] | None, now: str) -> float:
    """Seconds until a failed fetch Job is tried again (<= 0: now)."""
    since = failed_at(job)
    if since is None:
        return 0.0
    age = (datetime.fromisoformat(now) - datetime.fromisoformat(since)).total_seconds()
    return RETRY_SECONDS - age


class ModelCache:
    """Per reconcile: what each slot's model looks like, the index writes, and the retries of
    failed fetches."""

    def __init__(self, kube: KubeApi) -> None:
        self.kube = kube
        self.pods = FetchPods()

    async def observe(
        self, children: Children, lds: list[LLMDeployment]
    ) -> dict[tuple[str, str, str], ModelObserved]:
        """(namespace, fetch key, Job name) -> what is seen, for the deployments' specs (both
        slots of a canary may ask for different revisions)."""
        seen: dict[tuple[str, str, str], ModelObserved] = {}
        for ld in lds:
            request = model_request(ld.spec)
            if request is None:
                continue
            job_name = names.model_fetch_job(ld.name, request.fetch_key)
            key = (ld.namespace, request.fetch_key, job_name)
            if key in seen:
                continue
            index = children.get(("ConfigMap", ld.namespace, MODEL_INDEX))
            job = children.get(("Job", ld.namespace, job_name))
            pod = self.pods.of(ld.namespace, job_name)
            seen[key] = observed(index, job, pod, request.fetch_key)
        return seen

    async def retry(self, children: Children, namespace: str, job_name: str, now: str) -> float:
        """A failed fetch: delete its Job once RETRY_SECONDS have passed (the next pass creates it
        again); returns when to look again."""
        job = children.get(("Job", namespace, job_name))
        wait = retry_in(job, now)
        if job is None or wait > 0:
            return max(wait, 1.0)
        await self.kube.delete("Job", namespace, job_name)  # its DELETED event queues the next pass
        self.pods.forget_job(namespace, job_name)
        return 1.0

    async def record(self, namespace: str, entries: dict[str, str]) -> None:
        if entries:
            await self.kube.add_configmap_keys(namespace, MODEL_INDEX, entries)

    async def settle(
        self, children: Children, ld: LLMDeployment, wants: Sequence[Desired], now: str
    ) -> tuple[list[tuple[str, str, str]], float | None]:
        """After the pass's Jobs exist: index the finished fetches (Event ModelFetched), retry the
        failed ones. Returns the Events (type, reason, message) and when to look again."""
        events: list[tuple[str, str, str]] = []
        later: list[float] = []
        for want in wants:
            model = want.model
            if want.model_record:
                await self.record(ld.namespace, want.model_record)
                events.append(("Normal", "ModelFetched", fetched_message(ld, model.observed)))
            if model.state == ModelState.FAILED:
                later.append(await self.retry(children, ld.namespace, model.job, now))
        return events, min(later) if later else None


def fetched_message(ld: LLMDeployment, seen: ModelObserved) -> str:
    cache = ld.spec.model.cache
    claim = cache.claim_name if cache else ""
    size = f"{seen.total_bytes} bytes" if seen.total_bytes is not None else "its files"
    files = f", {seen.total_files} files" if seen.total_files is not None else ""
    return (
        f"{ld.spec.model.source.uri} (revision {seen.resolved_revision}) is in the model cache: "
        f"claim {claim}, {seen.directory} ({size}{files})"
    )
