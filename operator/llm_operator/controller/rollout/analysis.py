"""Canary analysis measurements: rollout/queries.py's PromQL sent to an allowed Prometheus (I/O).

One call measures one window (the analysis interval, ending now) of every metric that has a bound
in the spec. Never a silent pass: an unreachable Prometheus, an HTTP error or an answer that is not
one number is a Measurement with `error` set (the analysis's consecutive-error limit applies); a
query without data (no series, or no requests to divide by) is a Measurement with value None.

The URL is one of the operator's allowed endpoints (controller/rollout/prometheus_urls.py; Rollouts
refuses any other before anything is queried). Still, whatever answers there is not trusted:
redirects are not followed, and no part of an answer's body reaches status, Events or logs. An
error is a fixed sentence per kind of failure, with at most the HTTP status, a sample count and
Prometheus's errorType when it is one of the types Prometheus defines.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

import aiohttp

from llm_operator.api.v1alpha1 import CanaryAnalysis
from llm_operator.rollout import queries
from llm_operator.rollout.types import Measurement

DEFAULT_INTERVAL_SECONDS = 60
TIMEOUT_SECONDS = 10.0
MAX_ANSWER_BYTES = 1 << 20  # one instant vector of one sample is a few hundred bytes
# Prometheus's errorType values (web/api/v1): a fixed set, so safe to repeat; anything else is not.
ERROR_TYPES = frozenset(
    ("timeout", "canceled", "execution", "bad_data", "internal", "unavailable", "not_found", "not_acceptable")
)
# Metric -> the CanaryAnalysis field bounding it: a metric is measured when its bound is set.
BOUNDS = {
    queries.ERROR_RATE: "max_error_rate_percent",
    queries.P99_LATENCY: "max_p99_latency_milliseconds",
    queries.TIME_TO_FIRST_TOKEN: "max_time_to_first_token_milliseconds",
    queries.MEAN_QUEUE_TIME: "max_mean_queue_time_milliseconds",
}


class QueryError(Exception):
    """The query got no usable answer; the message says why in fixed words, never the answer's."""


def measured_metrics(analysis: CanaryAnalysis) -> list[str]:
    return [metric for metric, field in BOUNDS.items() if getattr(analysis, field, None) is not None]


def _error_type(answer: Any) -> str:
    kind = answer.get("errorType") if isinstance(answer, dict) else None
    return f" (errorType {kind})" if isinstance(kind, str) and kind in ERROR_TYPES else ""


def _value(answer: Any) -> float | None:
    """The one sample of an instant query's answer; None without one, or when it is no number
    (NaN: nothing to divide by; Inf: a division by zero requests)."""
    if not isinstance(answer, dict) or answer.get("status") != "success":
        if isinstance(answer, dict) and answer.get("status") == "error":
            raise QueryError(f"Prometheus refused the query{_error_type(answer)}")
        raise QueryError("Prometheus answered JSON that is not a query result")
    data = answer.get("data")
    result = data.get("result") if isinstance(data, dict) else None
    if not isinstance(data, dict) or data.get("resultType") != "vector" or not isinstance(result, list):
        raise QueryError("Prometheus answered a result that is not an instant vector")
    if not result:
        return None
    if len(result) > 1:
        raise QueryError(f"expected one sample, Prometheus answered {len(result)}")
    try:
        value = float(result[0]["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        raise QueryError("Prometheus answered a sample that is not a number") from None
    return value if math.isfinite(value) else None


async def _body(response: aiohttp.ClientResponse) -> bytes:
    body = b""
    async for chunk in response.content.iter_chunked(1 << 16):
        body += chunk
        if len(body) > MAX_ANSWER_BYTES:
            raise QueryError(f"Prometheus answered more than {MAX_ANSWER_BYTES >> 20} MiB")
    return body


async def query(session: aiohttp.ClientSession, url: str, promql: str, at: float) -> float | None:
    """An instant query at `at` (seconds since the epoch): its one value, None without data."""
    endpoint = f"{url.rstrip('/')}/api/v1/query"
    params = {"query": promql, "time": f"{at:.3f}"}
    try:
        async with session.get(endpoint, params=params, allow_redirects=False) as response:
            status = response.status
            if 300 <= status < 400:
                raise QueryError(f"Prometheus answered HTTP {status}, a redirect, which is not followed")
            json_body = response.content_type == "application/json"
            body = await _body(response) if json_body else b""
    except QueryError:
        raise
    except TimeoutError:
        raise QueryError(f"Prometheus did not answer within {TIMEOUT_SECONDS:g} s") from None
    except (aiohttp.ClientError, OSError, ValueError) as e:
        # The exception's class, never its text: that may quote what the server sent.
        raise QueryError(f"cannot query Prometheus at {url}: {type(e).__name__}") from None
    try:
        answer = json.loads(body) if json_body else None
    except (ValueError, RecursionError):
        answer, json_body = None, False
    if status != 200:
        raise QueryError(f"Prometheus answered HTTP {status}{_error_type(answer)}")
    if not json_body:
        raise QueryError("Prometheus answered HTTP 200 with a body that is not JSON")
    return _value(answer)


async def measure(
    url: str,
    analysis: CanaryAnalysis,
    namespace: str,
    deployment: str,
    revision: str,
) -> list[Measurement]:
    """One Measurement per metric with a bound, over the window that ends now (queries.py: what
    each counts)."""
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
