"""Canary analysis measurements: rollout/queries.py's PromQL sent to the spec's Prometheus (I/O).

One call measures one window (the analysis interval, ending now) of every metric that has a bound
in the spec. Never a silent pass: an unreachable Prometheus, an HTTP error or an answer that is not
one number is a Measurement with `error` set (the analysis's consecutive-error limit applies); a
query without data (no series, or no requests to divide by) is a Measurement with value None.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import aiohttp

from llm_operator.api.v1alpha1 import CanaryAnalysis
from llm_operator.rollout import queries
from llm_operator.rollout.types import Measurement

DEFAULT_INTERVAL_SECONDS = 60
TIMEOUT_SECONDS = 10.0
# Metric -> the CanaryAnalysis field bounding it: a metric is measured when its bound is set.
BOUNDS = {
    queries.ERROR_RATE: "max_error_rate_percent",
    queries.P99_LATENCY: "max_p99_latency_milliseconds",
    queries.TIME_TO_FIRST_TOKEN: "max_time_to_first_token_milliseconds",
    queries.MEAN_QUEUE_TIME: "max_mean_queue_time_milliseconds",
}


class QueryError(Exception):
    """The query got no usable answer; the message says why, in words for status."""


def measured_metrics(analysis: CanaryAnalysis) -> list[str]:
    return [metric for metric, field in BOUNDS.items() if getattr(analysis, field, None) is not None]


def _value(answer: Any) -> float | None:
    """The one sample of an instant query's answer; None without one, or when it is no number
    (NaN: nothing to divide by; Inf: a division by zero requests)."""
    if not isinstance(answer, dict) or answer.get("status") != "success":
        error = answer.get("error") if isinstance(answer, dict) else None
        raise QueryError(f"Prometheus refused the query: {str(error) if error else repr(answer):.200}")
    data = answer.get("data") or {}
    result = data.get("result")
    if data.get("resultType") != "vector" or not isinstance(result, list):
        raise QueryError(f"unexpected answer from Prometheus: {data!r:.200}")
    if not result:
        return None
    if len(result) > 1:
        raise QueryError(f"expected one sample, Prometheus answered {len(result)}")
    try:
        value = float(result[0]["value"][1])
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise QueryError(f"unexpected sample from Prometheus: {result[0]!r:.200}") from e
    return value if math.isfinite(value) else None


async def query(session: aiohttp.ClientSession, url: str, promql: str, at: float) -> float | None:
    """An instant query at `at` (seconds since the epoch): its one value, None without data."""
    endpoint = f"{url.rstrip('/')}/api/v1/query"
    try:
        async with session.get(endpoint, params={"query": promql, "time": f"{at:.3f}"}) as response:
            if response.status >= 500 or response.content_type != "application/json":
                text = (await response.text())[:200]
                raise QueryError(f"Prometheus at {url} answered HTTP {response.status}: {text}")
            answer = await response.json()
    except QueryError:
        raise
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        raise QueryError(f"cannot query Prometheus at {url}: {type(e).__name__}: {e}".rstrip(": ")) from e
    return _value(answer)


async def measure(
    url: str, analysis: CanaryAnalysis, namespace: str, deployment: str, revision: str
) -> list[Measurement]:
    """One Measurement per metric with a bound, over the window that ends now."""
    metrics = measured_metrics(analysis)
    if not metrics:
        return []
    window = int(getattr(analysis, "interval_seconds", None) or DEFAULT_INTERVAL_SECONDS)
    target = queries.Target(namespace, deployment, revision, window)
    promql = queries.queries(target)
    at = time.time()  # one instant for every query: they measure the same window
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_SECONDS)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        try:
            requests = round(await query(session, url, queries.requests(target), at) or 0.0)
        except QueryError as e:
            return [Measurement(metric, None, 0, error=str(e)) for metric in metrics]
        answers = await asyncio.gather(
            *(query(session, url, promql[metric], at) for metric in metrics), return_exceptions=True
        )
    out = []
    for metric, answer in zip(metrics, answers, strict=True):
        if isinstance(answer, QueryError):
            out.append(Measurement(metric, None, requests, error=str(answer)))
        elif isinstance(answer, BaseException):
            raise answer
        else:
            out.append(Measurement(metric, answer, requests))
    return out
