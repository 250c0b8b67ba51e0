"""bench P9 reads aiperf's summary export (profile_export_aiperf.json, aiperf 0.13.0) as it is
written: these are trimmed from real runs, one clean and one with failed requests."""

from __future__ import annotations

from typing import Any

from bench.routing import Side, summary

CLEAN: dict[str, Any] = {
    "schema_version": "1.0",
    "request_throughput": {"unit": "requests/sec", "avg": 3.7967150396245084},
    "request_count": {"unit": "requests", "avg": 19.0},
    "time_to_first_token": {"unit": "ms", "avg": 13.35, "p50": 13.16697, "p90": 13.85, "p99": 17.74107544,
                            "min": 12.1, "max": 18.27, "count": 19},
    "error_request_count": None,  # no error: the metric has no samples
    "error_summary": [],
}  # fmt: skip
FAILING: dict[str, Any] = {
    "request_throughput": {"unit": "requests/sec", "avg": 2.6601138928428245},
    "request_count": {"unit": "requests", "avg": 8.0},  # the successful ones
    "error_request_count": {"unit": "requests", "avg": 3.0},
    "completed_request_count": {"unit": "requests", "avg": 11.0},
    "time_to_first_token": {"unit": "ms", "p50": 12.0, "p99": 20.0},
    "error_summary": [{"error_details": {"code": 500, "type": "Internal Server Error"}, "count": 3}],
}


def test_the_summary_is_read_with_and_without_errors() -> None:
    assert summary(CLEAN) == Side(ttft_p50_ms=13.16697, ttft_p99_ms=17.74107544,
                                  throughput=3.7967150396245084, requests=19, errors=0)  # fmt: skip
    assert summary(FAILING) == Side(ttft_p50_ms=12.0, ttft_p99_ms=20.0, throughput=2.6601138928428245,
                                    requests=8, errors=3)  # fmt: skip
