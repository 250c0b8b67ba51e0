"""What status says about the model cache (status.model, condition ModelCached): pure, for the
status reducer (controller/status/status.py)."""

from __future__ import annotations

from typing import Any

from llm_operator.controller.status.conditions import FAILED_POD, LAUNCHER_REFUSED, cond
from llm_operator.engine.state import ModelState, ModelStatus

CONDITION = "ModelCached"
RETRY_SECONDS = 120.0  # a failed fetch is tried again this long after it failed (model_cache.py)
FETCHING = "FetchingModel"  # the deployment's reason while its model is fetched


def fields(model: ModelStatus | None) -> dict[str, Any] | None:
    """status.model; None for sources read in place."""
    if model is None or model.state == ModelState.NOT_CACHED:
        return None
    seen = model.observed
    values = {
        "cacheKey": model.cache_key,
        "directory": seen.directory or None,
        "resolvedRevision": seen.resolved_revision or None,
        "bytesFetched": seen.bytes,
        "bytesTotal": seen.total_bytes,
        "filesFetched": seen.files,
        "filesTotal": seen.total_files,
    }
    return {k: v for k, v in values.items() if v is not None}


def fetching_message(model: ModelStatus) -> str:
    """The Job and its start; its byte progress is in its log (`kubectl logs job/<Job>`), which
    the operator does not read (that takes pods/log on every pod)."""
    started = f" started {model.observed.started}" if model.observed.started else ""
    return (
        f"fetching model {model.cache_key} (Job {model.job}{started}; progress: kubectl logs job/{model.job})"
    )


def failure(model: ModelStatus | None) -> tuple[str, str] | None:
    """(reason, message) of a failed fetch: the fetcher's reason and its words, and when it is
    tried again."""
    if model is None or model.state != ModelState.FAILED:
        return None
    seen = model.observed
    message = (
        f"model fetch Job {model.job}: {seen.message or seen.reason}; tried again every "
        f"{RETRY_SECONDS:.0f} s while the spec is unchanged"
    )
    return seen.reason or "FetchFailed", message


def condition(model: ModelStatus | None, generation: int) -> list[dict[str, Any]]:
    """ModelCached, only for sources the operator fetches."""
    if model is None or model.state == ModelState.NOT_CACHED:
        return []
    if model.state == ModelState.READY:
        seen = model.observed
        text = (
            f"{seen.directory} (revision {seen.resolved_revision})"
            if seen.resolved_revision
            else seen.directory
        )
        return [cond(CONDITION, True, "ModelCached", text, generation)]
    if model.state == ModelState.FETCHING:
        return [cond(CONDITION, False, "Fetching", fetching_message(model), generation)]
    reason, message = failure(model) or ("FetchFailed", "")
    return [cond(CONDITION, False, reason, message, generation)]


def without_fetch_attempts(model: ModelStatus | None, pod_problems: tuple[str, ...]) -> tuple[str, ...]:
    """A fetch pod that exited badly belongs to the model's condition (the Job retries it, or the
    fetcher's reason says why it stopped; its exit 78 is not a serving launcher's refusal), not
    among the serving pods that cannot run. A fetch pod that cannot start (a missing Secret, no
    node, an image) stays there: only the cluster can say why."""
    if model is None or not model.job:
        return pod_problems
    prefix = f"{model.job}-"
    ended = (f": {FAILED_POD}: ", f": {LAUNCHER_REFUSED}: ")
    return tuple(p for p in pod_problems if not (p.startswith(prefix) and any(e in p for e in ended)))
