"""TEST-ONLY fault knob of the CPU reference runtime: what a bad canary looks like, on demand.

Canary analysis (docs/rollouts.md) must see a bad revision fail on real Triton metrics. A change
that makes the tiny CPU model worse on purpose is set through the serving container's environment
(`spec.runtime.env`; these are the only LLMOP_* names a user may set):

- LLMOP_FAULT_ERROR_PERCENT (0..100): that share of requests is answered with an error, which
  Triton counts in nv_inference_request_failure. Deterministic: request n (counted per model
  instance from 0) fails when floor((n+1) p / 100) > floor(n p / 100), so exactly p of every 100
  consecutive requests fail, spread evenly (p=10: requests 9, 19, 29, ...).
- LLMOP_FAULT_LATENCY_MS: added to every request after its last token, before its final response
  (so to its latency, not to its time to first token, unless that response is its only one).
- LLMOP_FAULT_TTFT_MS: added before the first token of every request (a slow prefill). A sleep
  per batch: the instance is as wide as before, only later.
- LLMOP_FAULT_STEP_MS: added to every engine step for each sequence in it (the prompt's step, then
  each token's), so a step of n sequences takes n x this much longer: an engine with less capacity,
  as a slower GPU pool at its compute limit has. One model instance then makes at most
  1000 / STEP_MS tokens per second, whatever its batch, and requests offered faster queue behind it
  (routing tests' straggler: its load gauges stay up while it works through its queue).
- LLMOP_FAULT_PODS: comma-separated pod names; when set, the knob is on only in those pods (the
  pod's host name, which is its name in a StatefulSet: `<name>-2`), so one replica of a revision
  can be a straggler beside healthy ones (routing tests). Unset: every pod of the revision.

The TensorRT-LLM runtime has no such knob: it is a test instrument, never a production feature.
Stdlib only, like the rest of the runtime (the serving image installs no operator dependencies).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

ERROR_PERCENT = "LLMOP_FAULT_ERROR_PERCENT"
LATENCY_MS = "LLMOP_FAULT_LATENCY_MS"
TTFT_MS = "LLMOP_FAULT_TTFT_MS"
STEP_MS = "LLMOP_FAULT_STEP_MS"
PODS = "LLMOP_FAULT_PODS"
NAMES = (ERROR_PERCENT, LATENCY_MS, TTFT_MS, STEP_MS)
# How a failure the knob injects begins: the server's own failure (INTERNAL), not a refusal.
INJECTED = "injected fault"
MAX_DELAY_MS = 600_000.0  # ten minutes: more is a typo, not a test


@dataclass(frozen=True)
class Faults:
    error_percent: float = 0.0
    latency_ms: float = 0.0
    ttft_ms: float = 0.0
    step_ms: float = 0.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str], hostname: str) -> Faults:
        """The knob's settings in the pod named `hostname`; ValueError naming the variable when
        one is not a valid number (in every pod, so a typo never hides behind LLMOP_FAULT_PODS)."""

        def number(name: str, high: float) -> float:
            raw = environ.get(name, "").strip()
            if not raw:
                return 0.0
            try:
                value = float(raw)
            except ValueError:
                value = math.nan
            if not 0.0 <= value <= high:  # also refuses nan and inf
                raise ValueError(f"{name}={raw!r}: expected a number from 0 to {high:g}")
            return value

        faults = cls(
            error_percent=number(ERROR_PERCENT, 100.0),
            latency_ms=number(LATENCY_MS, MAX_DELAY_MS),
            ttft_ms=number(TTFT_MS, MAX_DELAY_MS),
            step_ms=number(STEP_MS, MAX_DELAY_MS),
        )
        pods = environ.get(PODS, "").strip()
        if pods and hostname not in {p.strip() for p in pods.split(",")}:
            return cls()
        return faults

    @property
    def active(self) -> bool:
        return bool(self.error_percent or self.latency_ms or self.ttft_ms or self.step_ms)

    def fails(self, n: int) -> bool:
        """Whether request number n (0-based) is answered with an injected error."""
        p = self.error_percent
        return math.floor((n + 1) * p / 100) > math.floor(n * p / 100)

    def step_delay_ms(self, sequences: int) -> float:
        """What the knob adds to one engine step holding `sequences` unfinished sequences."""
        return self.step_ms * sequences

    def describe(self) -> str:
        """For the server log: a faulty pod must say so."""
        values = (self.error_percent, self.latency_ms, self.ttft_ms, self.step_ms)
        return ", ".join(f"{name}={value:g}" for name, value in zip(NAMES, values, strict=True) if value)
