"""Analysis with Argo Rollouts' semantics over the canary's measurements (pure).

Each measurement (one metric, one window) is Successful, Failed (value above the budget),
Inconclusive (fewer than minRequests requests, or no data: no traffic is never a success) or
Error (the query failed). The run is Failed when failed windows exceed failureLimit, Error when
consecutive query errors exceed consecutiveErrorLimit, Inconclusive when inconclusive windows exceed
inconclusiveLimit; Failed and Error abort the canary, Inconclusive pauses it for a person.
Values: errorRate in percent, latencies in milliseconds; above the budget fails.
"""

from __future__ import annotations

from datetime import datetime

from llm_operator.api.v1alpha1 import AnalysisMetric, AnalysisPhase, CanaryAnalysis, MetricStatus
from llm_operator.rollout.types import Measurement

LABELS = {
    AnalysisMetric.ERROR_RATE: "error rate",
    AnalysisMetric.P99_LATENCY: "p99 latency",
    AnalysisMetric.TIME_TO_FIRST_TOKEN: "p99 TTFT",
    AnalysisMetric.MEAN_QUEUE_TIME: "mean queue time",
}


def bounds(analysis: CanaryAnalysis) -> dict[AnalysisMetric, int]:
    """The metrics the spec checks, with their budgets."""
    every = {
        AnalysisMetric.ERROR_RATE: analysis.max_error_rate_percent,
        AnalysisMetric.P99_LATENCY: analysis.max_p99_latency_milliseconds,
        AnalysisMetric.TIME_TO_FIRST_TOKEN: analysis.max_time_to_first_token_milliseconds,
        AnalysisMetric.MEAN_QUEUE_TIME: analysis.max_mean_queue_time_milliseconds,
    }
    return {metric: bound for metric, bound in every.items() if bound is not None}


def quantity(metric: AnalysisMetric, value: float) -> str:
    """1,840 ms; 3.2% (one decimal below 10%, none above)."""
    if metric == AnalysisMetric.ERROR_RATE:
        text = f"{value:,.1f}" if value < 10 else f"{value:,.0f}"
        return f"{text.removesuffix('.0')}%"
    return f"{value:,.0f} ms"


def judge(
    m: Measurement, metric: AnalysisMetric, bound: int, analysis: CanaryAnalysis
) -> tuple[AnalysisPhase, str]:
    """One window of one metric: its phase and what it means in words."""
    label = f"canary {LABELS[metric]}"
    window = f"the {analysis.interval_seconds} s window"
    if m.error is not None:
        return AnalysisPhase.ERROR, f"{label}: the query failed: {m.error}"
    if m.requests < analysis.min_requests:
        return (
            AnalysisPhase.INCONCLUSIVE,
            f"{label}: only {m.requests} requests in {window}, {analysis.min_requests} needed",
        )
    if m.value is None:
        return AnalysisPhase.INCONCLUSIVE, f"{label}: no data in {window}"
    if m.value > bound:
        return AnalysisPhase.FAILED, f"{label} {quantity(metric, m.value)} > budget {quantity(metric, bound)}"
    return (
        AnalysisPhase.SUCCESSFUL,
        f"{label} {quantity(metric, m.value)} <= budget {quantity(metric, bound)}",
    )


def record(
    old: MetricStatus, m: Measurement, phase: AnalysisPhase, message: str, now: datetime
) -> MetricStatus:
    """The metric's counters after one more window."""
    errored = phase == AnalysisPhase.ERROR
    return old.model_copy(
        update={
            "successful": old.successful + (phase == AnalysisPhase.SUCCESSFUL),
            "failed": old.failed + (phase == AnalysisPhase.FAILED),
            "inconclusive": old.inconclusive + (phase == AnalysisPhase.INCONCLUSIVE),
            "errors": old.errors + errored,
            "consecutive_errors": old.consecutive_errors + 1 if errored else 0,
            "step_successful": old.step_successful + (phase == AnalysisPhase.SUCCESSFUL),
            "last_value": old.last_value if errored else m.value,
            "last_phase": phase,
            "last_message": message,
            "last_at": now,
        }
    )


def windows(ms: MetricStatus) -> int:
    """Windows measured (query errors are not windows)."""
    return ms.successful + ms.failed + ms.inconclusive


def verdict(metrics: list[MetricStatus], analysis: CanaryAnalysis) -> tuple[AnalysisPhase, str | None]:
    """The run's phase and, when it is over, why in the user's words (worst first, as Argo)."""
    for ms in metrics:
        if ms.failed > analysis.failure_limit:
            return AnalysisPhase.FAILED, failed_words(ms)
    for ms in metrics:
        if ms.consecutive_errors > analysis.consecutive_error_limit:
            return AnalysisPhase.ERROR, (
                f"the canary's {LABELS[ms.name]} could not be measured {ms.consecutive_errors} times in "
                f"a row (consecutiveErrorLimit {analysis.consecutive_error_limit}): {ms.last_message}"
            )
    for ms in metrics:
        if ms.inconclusive > analysis.inconclusive_limit:
            return AnalysisPhase.INCONCLUSIVE, (
                f"analysis inconclusive: {ms.last_message} ({ms.inconclusive} of {windows(ms)} windows "
                f"inconclusive, inconclusiveLimit {analysis.inconclusive_limit})"
            )
    return AnalysisPhase.RUNNING, None


def failed_words(ms: MetricStatus) -> str:
    """'canary p99 TTFT 1,840 ms > budget 1,000 ms in 2 of 3 windows'."""
    what = (
        ms.last_message if ms.last_phase == AnalysisPhase.FAILED else f"canary {LABELS[ms.name]} over budget"
    )
    return f"{what} in {ms.failed} of {windows(ms)} windows"


def measure(
    metrics: list[MetricStatus],
    measurements: list[Measurement],
    analysis: CanaryAnalysis,
    now: datetime,
) -> tuple[list[MetricStatus], list[tuple[AnalysisPhase, str]]]:
    """Fold one round of measurements into the counters; also returns each window's phase and words."""
    budget = bounds(analysis)
    by_name = {ms.name: ms for ms in metrics}
    judged: list[tuple[AnalysisPhase, str]] = []
    for m in measurements:
        try:
            metric = AnalysisMetric(m.metric)
        except ValueError:
            continue  # not a metric this operator knows: the query side's mistake, not the user's
        if metric not in budget:
            continue
        phase, message = judge(m, metric, budget[metric], analysis)
        by_name[metric] = record(by_name.get(metric, MetricStatus(name=metric)), m, phase, message, now)
        judged.append((phase, message))
    return [by_name[metric] for metric in budget if metric in by_name], judged


def fresh(analysis: CanaryAnalysis) -> list[MetricStatus]:
    return [MetricStatus(name=metric) for metric in bounds(analysis)]


def new_step(metrics: list[MetricStatus]) -> list[MetricStatus]:
    return [ms.model_copy(update={"step_successful": 0}) for ms in metrics]


def missing_successes(metrics: list[MetricStatus], analysis: CanaryAnalysis) -> list[AnalysisMetric]:
    """Metrics without a successful window in this step yet: the step must not advance."""
    done = {ms.name for ms in metrics if ms.step_successful > 0}
    return [metric for metric in bounds(analysis) if metric not in done]
