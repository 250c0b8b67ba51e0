"""The preStop drain's parser of Triton's metrics page (runtime/drain.py): standard library only, as
everything that runs inside NVIDIA's image, so it is checked here against prometheus_client's
parser (the operator's own dependency) on the page a Triton + TensorRT-LLM pod serves."""

from __future__ import annotations

import math

import pytest
from llm_operator.runtime.drain import inflight, samples
from prometheus_client.parser import text_string_to_metric_families

# What Triton 2.64 with the TensorRT-LLM backend writes on :8002/metrics (trimmed): HELP and TYPE
# lines, counters without _total, gauges, a histogram, a label value needing escapes.
PAGE = r"""# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="ensemble",version="1"} 12
nv_inference_request_success{model="tensorrt_llm",version="1"} 12
# HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting execution.
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="ensemble",version="1"} 2
nv_inference_pending_request_count{model="tensorrt_llm",version="1"} 0
# HELP nv_trt_llm_request_metrics TRT LLM request metrics
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 1
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="context",version="1"} 1
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"} 4
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 64
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 4
# HELP nv_inference_first_response_histogram_ms Duration from request to first response in milliseconds
# TYPE nv_inference_first_response_histogram_ms histogram
nv_inference_first_response_histogram_ms_count{model="ensemble",version="1"} 12
nv_inference_first_response_histogram_ms_sum{model="ensemble",version="1"} 381.5
nv_inference_first_response_histogram_ms_bucket{model="ensemble",version="1",le="100"} 3
nv_inference_first_response_histogram_ms_bucket{model="ensemble",version="1",le="+Inf"} 12
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{gpu_uuid="GPU-1", note="a \"quoted\", {braced} \\ value\n"} NaN
nv_cpu_memory_total_bytes 1.6e+10
"""


def test_the_samples_are_prometheus_clients() -> None:
    theirs = [(s.name, s.labels, s.value) for f in text_string_to_metric_families(PAGE) for s in f.samples]
    ours = samples(PAGE)
    assert len(ours) == len(theirs) == 15
    for (name, labels, value), (t_name, t_labels, t_value) in zip(ours, theirs, strict=True):
        # prometheus_client names a counter's samples <name>_total; Triton's have no suffix.
        assert (name, labels) == (t_name.removesuffix("_total"), t_labels)
        assert value == t_value or (math.isnan(value) and math.isnan(t_value))


def test_inflight_counts_pending_waiting_and_active_only() -> None:
    # 2 pending in the ensemble, 1 waiting and 4 active in the batcher; "max" and the rest are not.
    assert inflight(PAGE) == 7
    assert inflight("") == 0


def test_timestamps_and_spacing_are_accepted() -> None:
    assert samples('m{ a = "1" , b="2", } 3 1712345678000\n') == [("m", {"a": "1", "b": "2"}, 3.0)]


@pytest.mark.parametrize(
    "line",
    ["<html>not metrics</html>", 'm{a="1" 3', "m{a=1} 3", "m{} three", 'm{a="1"b="2"} 3'],
)
def test_what_is_not_a_metrics_page_raises(line: str) -> None:
    """drain() stops waiting on a ValueError: a page it cannot read is no reason to hold a pod."""
    with pytest.raises(ValueError, match=r"."):
        samples(line)
