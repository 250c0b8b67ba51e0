"""Analysis with Argo Rollouts' semantics: each window's phase, the run's limits, the words."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from llm_operator.api.v1alpha1 import AnalysisMetric, AnalysisPhase, CanaryAnalysis, MetricStatus
from llm_operator.rollout import analysis as an
from llm_operator.rollout.types import Measurement

NOW = datetime(2026, 11, 23, 20, 0, tzinfo=UTC)
TTFT = AnalysisMetric.TIME_TO_FIRST_TOKEN


def spec(**fields: object) -> CanaryAnalysis:
    return CanaryAnalysis.model_validate(
        {
            "prometheus": {"url": "http://p:9090"},
            "minRequests": 20,
            "maxErrorRatePercent": 1,
            "maxP99LatencyMilliseconds": 800,
            "maxTimeToFirstTokenMilliseconds": 1000,
            "maxMeanQueueTimeMilliseconds": 200,
            **fields,
        }
    )


@pytest.mark.parametrize(
    ("measurement", "phase", "words"),
    [
        (
            Measurement("timeToFirstToken", 1840.0, 100),
            AnalysisPhase.FAILED,
            "canary p99 TTFT 1,840 ms > budget 1,000 ms",
        ),
        (
            Measurement("timeToFirstToken", 1000.0, 100),
            AnalysisPhase.SUCCESSFUL,
            "canary p99 TTFT 1,000 ms <= budget",
        ),
        (Measurement("errorRate", 3.25, 100), AnalysisPhase.FAILED, "canary error rate 3.2% > budget 1%"),
        (Measurement("errorRate", 0.0, 100), AnalysisPhase.SUCCESSFUL, "canary error rate 0% <= budget 1%"),
        (
            Measurement("p99Latency", 950.0, 20),
            AnalysisPhase.FAILED,
            "canary p99 latency 950 ms > budget 800 ms",
        ),
        (
            Measurement("meanQueueTime", 12.4, 50),
            AnalysisPhase.SUCCESSFUL,
            "mean queue time 12 ms <= budget 200 ms",
        ),
        # Too few requests is never a success, even with a perfect value.
        (
            Measurement("errorRate", 0.0, 19),
            AnalysisPhase.INCONCLUSIVE,
            "only 19 requests in the 60 s window, 20 needed",
        ),
        (Measurement("p99Latency", None, 100), AnalysisPhase.INCONCLUSIVE, "no data in the 60 s window"),
        (
            Measurement("p99Latency", None, 0, "connection refused"),
            AnalysisPhase.ERROR,
            "query failed: connection refused",
        ),
    ],
)
def test_each_window_is_judged(measurement: Measurement, phase: AnalysisPhase, words: str) -> None:
    metric = AnalysisMetric(measurement.metric)
    got, text = an.judge(measurement, metric, an.bounds(spec())[metric], spec())
    assert got == phase
    assert words in text


def _run(
    analysis: CanaryAnalysis, rounds: list[list[Measurement]]
) -> tuple[list[MetricStatus], AnalysisPhase, str | None]:
    metrics = an.fresh(analysis)
    phase, why = AnalysisPhase.RUNNING, None
    for measurements in rounds:
        metrics, _ = an.measure(metrics, measurements, analysis, NOW)
        phase, why = an.verdict(metrics, analysis)
    return metrics, phase, why


def ttft(value: float | None, requests: int = 100, error: str | None = None) -> list[Measurement]:
    return [Measurement("timeToFirstToken", value, requests, error)]


@pytest.mark.parametrize(
    ("limit", "rounds", "phase"),
    [
        (0, [ttft(1840.0)], AnalysisPhase.FAILED),  # failureLimit 0: the first failed window fails
        (1, [ttft(1840.0)], AnalysisPhase.RUNNING),
        (1, [ttft(1840.0), ttft(500.0), ttft(1840.0)], AnalysisPhase.FAILED),  # counted, not consecutive
    ],
)
def test_failure_limit(limit: int, rounds: list[list[Measurement]], phase: AnalysisPhase) -> None:
    assert _run(spec(failureLimit=limit), rounds)[1] == phase


def test_failed_run_names_the_metric_value_budget_and_windows() -> None:
    _, phase, why = _run(spec(failureLimit=1), [ttft(1840.0), ttft(500.0), ttft(1840.0)])
    assert phase == AnalysisPhase.FAILED
    assert why == "canary p99 TTFT 1,840 ms > budget 1,000 ms in 2 of 3 windows"


def test_consecutive_errors_over_the_limit_err_and_a_good_window_resets_them() -> None:
    down = ttft(None, 0, "Prometheus unreachable")
    metrics, phase, _ = _run(spec(consecutiveErrorLimit=2), [down, down, ttft(500.0), down, down])
    assert phase == AnalysisPhase.RUNNING
    ms = metrics[2]
    assert (ms.name, ms.errors, ms.consecutive_errors) == (TTFT, 4, 2)
    _, phase, why = _run(spec(consecutiveErrorLimit=2), [down, down, down])
    assert phase == AnalysisPhase.ERROR
    assert (
        why is not None
        and "3 times in a row (consecutiveErrorLimit 2)" in why
        and "Prometheus unreachable" in why
    )


def test_inconclusive_over_the_limit_pauses() -> None:
    quiet = ttft(900.0, requests=3)
    assert _run(spec(inconclusiveLimit=1), [quiet])[1] == AnalysisPhase.RUNNING
    _, phase, why = _run(spec(inconclusiveLimit=1), [quiet, quiet])
    assert phase == AnalysisPhase.INCONCLUSIVE
    assert why is not None and "only 3 requests" in why and "2 of 2 windows inconclusive" in why


def test_failed_is_worse_than_error_and_inconclusive() -> None:
    rounds = [
        [*ttft(None, 0, "timeout"), Measurement("errorRate", 5.0, 100), Measurement("p99Latency", 1.0, 2)]
    ]
    assert _run(spec(consecutiveErrorLimit=0), rounds)[1] == AnalysisPhase.FAILED


def test_only_configured_metrics_are_counted_and_unknown_names_are_ignored() -> None:
    analysis = CanaryAnalysis.model_validate({"prometheus": {"url": "http://p"}, "maxErrorRatePercent": 1})
    metrics, judged = an.measure(
        an.fresh(analysis),
        [
            Measurement("errorRate", 0.5, 100),
            Measurement("p99Latency", 9e9, 100),
            Measurement("bogus", 1.0, 100),
        ],
        analysis,
        NOW,
    )
    assert [(m.name, m.successful, m.step_successful) for m in metrics] == [(AnalysisMetric.ERROR_RATE, 1, 1)]
    assert len(judged) == 1


def test_a_step_needs_a_successful_window_of_every_metric() -> None:
    analysis = spec()
    metrics, _ = an.measure(
        an.fresh(analysis), [*ttft(500.0), Measurement("errorRate", 0.0, 100)], analysis, NOW
    )
    assert an.missing_successes(metrics, analysis) == [
        AnalysisMetric.P99_LATENCY,
        AnalysisMetric.MEAN_QUEUE_TIME,
    ]
    assert an.missing_successes(an.new_step(metrics), analysis) == list(an.bounds(analysis))


def test_an_error_keeps_the_last_value() -> None:
    metrics, _ = an.measure(an.fresh(spec()), ttft(640.0), spec(), NOW)
    metrics, _ = an.measure(metrics, ttft(None, 0, "timeout"), spec(), NOW)
    ttft_status = next(m for m in metrics if m.name == TTFT)
    assert (ttft_status.last_value, ttft_status.last_phase) == (640.0, AnalysisPhase.ERROR)
