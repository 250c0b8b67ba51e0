"""`python3 -m llm_operator.runtime.launcher drain`, the preStop hook: Triton has no drain API, and
a terminating pod leaves the Service endpoints at once while proxies learn it with a delay. So wait
for that, then until rank 0 has nothing in flight, bounded; SIGTERM and Triton's exit timeout
cover the rest.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import urllib.request
from pathlib import Path

from llm_operator.runtime.config import PodConfig
from llm_operator.runtime.supervisor import CLOSING_SIGNAL, LAUNCHER_PID_FILE, log

PENDING = "nv_inference_pending_request_count"
TRTLLM_REQUESTS = "nv_trt_llm_request_metrics"
TRTLLM_INFLIGHT_TYPES = ("active", "waiting")


# One sample line of Prometheus' text format: name, optional {labels}, value, optional timestamp.
_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?[0-9]+)?")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def samples(metrics: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of each sample in Prometheus' text exposition format. Our own parser,
    not prometheus_client's: this runs in NVIDIA's image, which has only the standard library of
    ours (render/inject.py), and needs only the samples of two gauges. ValueError on a line that
    is not a sample."""
    found = []
    for line in metrics.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.fullmatch(line)
        if m is None:
            raise ValueError(f"not a Prometheus sample: {line[:80]}")
        name, label_text, value = m.groups()
        label_text = (label_text or "").strip()
        labels: dict[str, str] = {}
        pos = 0
        while pos < len(label_text):
            lm = _LABEL.match(label_text, pos)
            if lm is None:
                raise ValueError(f"bad labels: {line[:80]}")
            labels[lm.group(1)] = re.sub(
                r"\\(.)", lambda e: "\n" if e.group(1) == "n" else e.group(1), lm.group(2)
            )
            pos = lm.end()
        found.append((name, labels, float(value)))
    return found


def inflight(metrics: str) -> float:
    """Requests queued in Triton or active in TensorRT-LLM's batcher (a python/ensemble request
    leaves Triton's queue when it reaches the backend, so the queue alone under-counts). Both are
    gauges, so their samples carry the family's name."""
    return sum(
        value
        for name, labels, value in samples(metrics)
        if name == PENDING
        or (name == TRTLLM_REQUESTS and labels.get("request_type") in TRTLLM_INFLIGHT_TYPES)
    )


def close_to_launches(c: PodConfig) -> None:
    """Tell the worker's launcher that its pod is stopping: it stops its launch agent at once (the
    running world stays), so no new leader starts ranks here while this hook waits on the old one."""
    with contextlib.suppress(OSError, ValueError):  # no launcher (any more): nothing to close
        os.kill(int((Path(c.runtime_dir) / LAUNCHER_PID_FILE).read_text()), CLOSING_SIGNAL)


def drain(c: PodConfig, poll: float = 0.5) -> int:
    """Give endpoint removal time to reach every proxy, then wait (bounded) until nothing is in
    flight on rank 0. Workers wait on their leader, so their ranks outlive its requests. Always 0:
    a failing preStop hook would only delay the SIGTERM that stops the pod anyway."""
    start = time.monotonic()
    if c.role == "worker":
        close_to_launches(c)
    host = c.leader_host if c.role == "worker" else "127.0.0.1"
    time.sleep(min(c.drain_settle, c.drain_timeout))
    if not host:
        return 0
    while True:
        try:
            url = f"http://{host}:{c.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=2) as response:
                pending = inflight(response.read().decode())
        except (OSError, ValueError):
            return 0  # not serving (any more): nothing to wait for
        if pending == 0:
            return 0
        if time.monotonic() - start >= c.drain_timeout:
            log(f"drain: {pending:g} requests still in flight after {c.drain_timeout:g}s; stopping anyway")
            return 0
        time.sleep(poll)
