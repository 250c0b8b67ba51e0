"""PromQL of canary analysis (pure): one query per metric of one revision over one window.

Series carry the scrape labels of the chart's PodMonitor and the test world's Prometheus (e2e/
cluster/monitoring.py): `namespace`, `pod`, and the pod labels `llmoperator_io_deployment`,
`llmoperator_io_revision`, `llmoperator_io_role`. Only leaders serve metrics. Requests are counted
on `tensorrt_llm` (COUNTED_MODEL), the model every request goes through on either contract and
every backend: the llmapi model, or the engine, which the OpenAI front door calls directly and the
`ensemble` of /v2 clients calls in turn (counting the ensemble too would count its requests twice
and miss the front door's). Every query answers one sample without labels, or nothing (no series:
no data).

What each value means (controller/rollout/analysis.py puts it in Measurement.value; the analysis fails a
window when value > the spec's bound):

- requests: successful plus failed requests of `tensorrt_llm` in the window, cancelled ones (the
  client left) excluded. Measurement.requests of every metric.
- errorRate (percent, bound maxErrorRatePercent): failed / (successful + failed) x 100, same
  counters. No requests: NaN, i.e. no data.
- p99Latency (milliseconds, bound maxP99LatencyMilliseconds): the highest 0.99 quantile of
  `nv_inference_request_summary_us` (end-to-end request duration, `--metrics-config
  summary_latencies=true`) any pod of the revision reported during the window. Triton's summary
  quantiles cover the pod's last minute or so (prometheus-cpp's sliding window) and cannot be
  merged across pods, so the worst pod's p99 is the honest, conservative value; Triton has no
  request-duration histogram that would allow an exact merged quantile.
- timeToFirstToken (milliseconds, bound maxTimeToFirstTokenMilliseconds): histogram_quantile(0.99)
  of `nv_inference_first_response_histogram_ms`, buckets summed over the revision's pods. The
  model repository has a bucket edge exactly at the budget and one above it (modelrepo.
  ttft_buckets_ms), so the value is an interpolated estimate of the p99 in ms, and
  "value > budget" holds exactly when more than 1 % of the window's first responses took longer
  than the budget (the bucket at the budget then holds less than 99 % of them).
- meanQueueTime (milliseconds, bound maxMeanQueueTimeMilliseconds): time the window's requests
  waited in Triton's queues (all the revision's models: an ensemble's request queues in it and
  in its composing models), per successful `tensorrt_llm` request.

Windows shorter than two scrape intervals hold too few samples for increase(): no data.
"""

from __future__ import annotations

from dataclasses import dataclass

ERROR_RATE = "errorRate"
P99_LATENCY = "p99Latency"
TIME_TO_FIRST_TOKEN = "timeToFirstToken"
MEAN_QUEUE_TIME = "meanQueueTime"
METRICS = (ERROR_RATE, P99_LATENCY, TIME_TO_FIRST_TOKEN, MEAN_QUEUE_TIME)
COUNTED_MODEL = "tensorrt_llm"
LEADER = "leader"


@dataclass(frozen=True)
class Target:
    """The revision's series, and the window measured (ending at the query's evaluation time)."""

    namespace: str
    deployment: str
    revision: str
    window_seconds: int


def _quote(value: str) -> str:
    """A PromQL string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def selector(t: Target, *extra: str, top_level: bool = True) -> str:
    """The label matchers of the revision's serving series (of COUNTED_MODEL's when top_level)."""
    matchers = [
        f"namespace={_quote(t.namespace)}",
        f"llmoperator_io_deployment={_quote(t.deployment)}",
        f"llmoperator_io_revision={_quote(t.revision)}",
        f"llmoperator_io_role={_quote(LEADER)}",
        *([f"model={_quote(COUNTED_MODEL)}"] if top_level else []),
        *extra,
    ]
    return "{" + ",".join(matchers) + "}"


def _increase(t: Target, metric: str, *extra: str, top_level: bool = True) -> str:
    return f"sum(increase({metric}{selector(t, *extra, top_level=top_level)}[{t.window_seconds}s]))"


def _successes(t: Target) -> str:
    succeeded = _increase(t, "nv_inference_request_success")
    return f"({succeeded} or vector(0))"


def _failures(t: Target) -> str:
    # Triton >= 24.08 labels failures by reason; a cancelled request is the client's doing.
    failed = _increase(t, "nv_inference_request_failure", 'reason!="CANCELED"')
    return f"({failed} or vector(0))"


def requests(t: Target) -> str:
    return f"{_successes(t)} + {_failures(t)}"


def error_rate(t: Target) -> str:
    return f"100 * {_failures(t)} / ({_successes(t)} + {_failures(t)})"


def p99_latency(t: Target) -> str:
    summary = "nv_inference_request_summary_us" + selector(t, 'quantile="0.99"')
    return f"max(max_over_time({summary}[{t.window_seconds}s])) / 1000"


def time_to_first_token(t: Target) -> str:
    buckets = f"nv_inference_first_response_histogram_ms_bucket{selector(t)}[{t.window_seconds}s]"
    return f"histogram_quantile(0.99, sum by (le) (increase({buckets})))"


def mean_queue_time(t: Target) -> str:
    queued = _increase(t, "nv_inference_queue_duration_us", top_level=False)
    succeeded = _increase(t, "nv_inference_request_success")
    return f"{queued} / {succeeded} / 1000"


def queries(t: Target) -> dict[str, str]:
    """Metric name -> its query."""
    return {
        ERROR_RATE: error_rate(t),
        P99_LATENCY: p99_latency(t),
        TIME_TO_FIRST_TOKEN: time_to_first_token(t),
        MEAN_QUEUE_TIME: mean_queue_time(t),
    }
