"""What both Triton models of the CPU reference runtime add to serving, whichever GPU contract they
speak (the engine contract's tensorrt_llm, model.py; the LLM API model, llmapi.py), so that every
test of the runtime holds on either: Triton's time-to-first-response histogram, and the TEST-ONLY fault knob
(faults.py). The callers pass triton_python_backend_utils, which only Triton's python stub imports.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from llm_operator.runtime.cpu_reference.decoding import Job
from llm_operator.runtime.cpu_reference.faults import ERROR_PERCENT, INJECTED, Faults


class FirstResponse:
    """nv_inference_first_response_histogram_ms{model, version}: milliseconds from the request
    reaching this model to its first response. Remove it when the CPU image moves to Triton >=
    24.11: the core then registers the same family itself (histogram_latencies=true)."""

    def __init__(self, pb_utils: Any, args: dict[str, str], buckets: list[float]) -> None:
        self.family = pb_utils.MetricFamily(
            name="nv_inference_first_response_histogram_ms",
            description="Duration from request to first response in milliseconds",
            kind=pb_utils.MetricFamily.HISTOGRAM,
        )
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.metric = self.family.Metric(labels=labels, buckets=buckets)

    def observe(self, job: Job, since: float) -> None:
        if not job.answered:
            job.answered = True
            self.metric.observe((time.monotonic() - since) * 1000.0)


def buckets(parameter: str) -> list[float]:
    """The `ttft_buckets_ms` parameter the operator renders: comma-separated edges."""
    return [float(b) for b in parameter.split(",")]


def fault_knob(pb_utils: Any) -> Faults:
    """This pod's fault knob; a bad setting fails the model's load, naming the variable."""
    try:
        faults = Faults.from_env(os.environ, socket.gethostname())
    except ValueError as e:
        raise pb_utils.TritonModelException(str(e)) from None
    if faults.active:
        pb_utils.Logger.log_warn(f"TEST-ONLY fault knob on: {faults.describe()}")
    return faults


def injected(faults: Faults) -> str:
    return f"{INJECTED} ({ERROR_PERCENT}={faults.error_percent:g}, test only)"


def delay(milliseconds: float) -> None:
    if milliseconds:
        time.sleep(milliseconds / 1000.0)
