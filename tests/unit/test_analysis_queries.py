"""Canary analysis queries (rollout/queries.py) evaluated by Prometheus's own engine (`promtool test
rules`) on Triton-shaped series: each selects only its revision's leaders and computes what its
docstring promises, and the TTFT value crosses the budget exactly where 1 % of first responses do."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator.controller.rollout.analysis import QueryError, _value
from llm_operator.rollout import queries as q

from tests.unit.test_monitoring_rules import needs_promtool, promtool

WINDOW_S = 60
EDGES = ("100", "500", "1000", "2000", "5000", "+Inf")


def series(
    name: str, pod: str, revision: str, per_15s: float, namespace: str = "ns", **labels: str
) -> dict[str, str]:
    """A counter growing by per_15s every 15 s (the scrape interval here)."""
    all_labels = {"namespace": namespace, "pod": pod, "llmoperator_io_deployment": "d",
                  "llmoperator_io_revision": revision, "llmoperator_io_role": "leader",
                  "model": "tensorrt_llm", "version": "1", **labels}  # fmt: skip
    body = ",".join(f'{k}="{v}"' for k, v in all_labels.items())
    return {"series": f"{name}{{{body}}}", "values": f"0+{per_15s}x40"}


def histogram(pod: str, revision: str, cumulative: tuple[float, ...]) -> list[dict[str, str]]:
    """nv_inference_first_response_histogram_ms: cumulative bucket growth per 15 s, per edge."""
    name = "nv_inference_first_response_histogram_ms"
    return [
        *(series(f"{name}_bucket", pod, revision, c, le=le) for le, c in zip(EDGES, cumulative, strict=True)),
        series(f"{name}_count", pod, revision, cumulative[-1]),
    ]


def revision_series(pod: str, revision: str, namespace: str = "ns") -> list[dict[str, str]]:
    """A busy pod: 15 successes, 5 failures and 15 cancellations per 15 s; 2 ms queued per request
    in tensorrt_llm's own queue (the model counted) and 1 ms in the ensemble's."""
    return [
        series("nv_inference_request_success", pod, revision, 15, namespace),
        series("nv_inference_request_failure", pod, revision, 5, namespace, reason="BACKEND"),
        series("nv_inference_request_failure", pod, revision, 15, namespace, reason="CANCELED"),
        series("nv_inference_queue_duration_us", pod, revision, 15 * 2000, namespace),
        series("nv_inference_queue_duration_us", pod, revision, 15 * 1000, namespace, model="ensemble"),
    ]


def summary(pod: str, revision: str, p99_us: float) -> dict[str, str]:
    gauge = series("nv_inference_request_summary_us", pod, revision, 0, quantile="0.99")
    return {**gauge, "values": f"{p99_us}x40"}


def case(expr: str, value: float | None) -> dict[str, Any]:
    """expr must answer value at 5 m (rounded to 0.001: interpolation leaves float noise), or nothing."""
    samples = [] if value is None else [{"labels": "{}", "value": value}]
    return {"expr": f"round({expr}, 0.001)", "eval_time": "5m", "exp_samples": samples}


def run(tmp_path: Path, inputs: list[dict[str, str]], cases: list[dict[str, Any]]) -> None:
    tests = {"rule_files": [], "evaluation_interval": "15s",
             "tests": [{"interval": "15s", "input_series": inputs, "promql_expr_test": cases}]}  # fmt: skip
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    result = promtool("test", "rules", str(tmp_path / "tests.yaml"))
    assert result.returncode == 0, result.stdout + result.stderr


def target(revision: str, namespace: str = "ns") -> q.Target:
    return q.Target(namespace, "d", revision, WINDOW_S)


@needs_promtool
def test_queries_compute_their_documented_values(tmp_path: Path) -> None:
    inputs = [
        # Canary "new": two pods.
        *revision_series("c0", "new"),
        *revision_series("c1", "new"),
        summary("c0", "new", 250_000),
        summary("c1", "new", 400_000),
        # 56 of 60 first responses per minute within 1000 ms (93 %): p99 interpolated at 1850 ms.
        *histogram("c0", "new", (0, 10, 14, 15, 15, 15)),
        # Stable "old", the canary of another namespace, and a worker: never in the canary's values.
        *revision_series("s0", "old"),
        series("nv_inference_request_failure", "s0", "old", 500, reason="BACKEND"),
        summary("s0", "old", 9_000_000),
        *histogram("s0", "old", (0, 0, 0, 0, 0, 15)),
        *revision_series("x0", "new", namespace="other"),
        series("nv_inference_request_failure", "x0", "new", 500, namespace="other", reason="BACKEND"),
        # "exact": 99 of 100 first responses within 1000 ms; "over": 98 of 100.
        *histogram("e0", "exact", (0, 0, 99, 100, 100, 100)),
        *histogram("o0", "over", (0, 0, 98, 100, 100, 100)),
        # "good": every first response within 500 ms.
        *histogram("g0", "good", (0, 15, 15, 15, 15, 15)),
    ]
    new = target("new")
    expected = [
        case(q.requests(new), 2 * (60 + 20)),  # cancellations excluded
        case(q.error_rate(new), 25.0),
        case(q.p99_latency(new), 400.0),  # the worst pod's
        case(q.time_to_first_token(new), 1850.0),
        case(q.mean_queue_time(new), 3.0),  # both models' queues per ensemble request
        case(q.time_to_first_token(target("exact")), 1000.0),  # not above the budget: passes
        case(q.time_to_first_token(target("over")), 1500.0),  # above it: fails
        case(q.time_to_first_token(target("good")), 496.0),
        # A revision without series: no requests, and no value for any metric.
        case(q.requests(target("none")), 0.0),
        *(case(expr, None) for expr in q.queries(target("none")).values() if "vector(0)" not in expr),
    ]
    run(tmp_path, inputs, expected)


@needs_promtool
def test_error_rate_without_requests_is_no_number(tmp_path: Path) -> None:
    """0/0: NaN, which measure() reports as no data (never as a 0 % error rate)."""
    idle = [series("nv_inference_request_success", "i0", "idle", 0)]
    rate = q.error_rate(target("idle"))
    run(tmp_path, idle, [case(f"{rate} > 0 or {rate} <= 0", None)])


@pytest.mark.parametrize("metric", q.METRICS)
def test_every_query_selects_the_revisions_leaders_only(metric: str) -> None:
    expr = q.queries(q.Target("team-a", "llama", "9a1b22c3d4", 120))[metric]
    labels = ("team-a", "llama", "9a1b22c3d4", "leader")
    for name, value in zip(("namespace", "llmoperator_io_deployment", "llmoperator_io_revision",
                            "llmoperator_io_role"), labels, strict=True):  # fmt: skip
        assert f'{name}="{value}"' in expr
    assert "[120s]" in expr
    # Label values are PromQL string literals, whatever they hold.
    assert q.selector(q.Target('a"b\\c', "d", "r", 60)).startswith('{namespace="a\\"b\\\\c",')


def answer(*values: str, result_type: str = "vector") -> dict[str, Any]:
    result = [{"metric": {}, "value": [1700000000.0, v]} for v in values]
    return {"status": "success", "data": {"resultType": result_type, "result": result}}


def test_an_answer_is_one_number_no_data_or_an_error() -> None:
    """How measure() reads Prometheus's instant-query answers (controller/rollout/analysis.py)."""
    assert _value(answer("12.5")) == 12.5
    # No series, 0/0 (NaN) and x/0 (Inf): no data, never a number the analysis could pass.
    for no_data in (answer(), answer("NaN"), answer("+Inf"), answer("-Inf")):
        assert _value(no_data) is None
    for bad, says in (
        (
            {"status": "error", "errorType": "bad_data", "error": "parse error"},
            "Prometheus refused the query (errorType bad_data)",
        ),
        (answer("1", "2"), "expected one sample, Prometheus answered 2"),
        (answer("1", result_type="matrix"), "Prometheus answered a result that is not an instant vector"),
        (answer("many"), "Prometheus answered a sample that is not a number"),
        ("<html>", "Prometheus answered JSON that is not a query result"),
    ):
        with pytest.raises(QueryError, match=re.escape(says)):
            _value(bad)
