"""P9, routing under imbalance on the embedded cluster's real node: three cpu-reference replicas of
one LLMDeployment, the third a straggler (e2e/cluster/straggler.py: the CPU runtime's TEST-ONLY
fault knob on that pod only); the same fixed request rate from a benchmark client users run
(aiperf, NVIDIA's genai-perf successor) through the client Service (kube-proxy's blind choice) and
through the router (Envoy with the endpoint picker), one after the other in one run. Printed side
by side: TTFT p50/p99, throughput, errors, and each side's straggler share from the pods' own
Triton counters. Goal: p99 TTFT through the router <= 0.5 x through the Service, throughput no
lower, 0 errors.

Two stragglers, one deployment each, in one run. The goal's is `capacity`: a slower GPU pool, every
token of every sequence in its batch slower (LLMOP_FAULT_STEP_MS), so it serves less than the
third of the rate a blind choice sends it and its queue grows; the picker sees it busy (scheduled
requests, KV-cache use) and sends it little. `latency` (a 1 s sleep before each batch's first
token, LLMOP_FAULT_TTFT_MS) is shown for comparison: its capacity is not lower, so it is idle
between requests like a healthy replica, a queue-based picker ties it with them, and every request
it still gets is 1 s late. docs/routing.md has the figures.

aiperf runs inside the cluster's network namespace (no route out of it: nothing can be fetched
from a hub), with the CPU model's own tokenizer directory written locally, from its own
environment (scripts/ensure-tool-venv.sh bench: its pins conflict with the operator's).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from llm_operator.contract import OPENAI_PORT
from llm_operator.runtime.cpu_reference import tokenizer_files

from bench.world import operator_in
from e2e.cluster import netns, straggler
from e2e.cluster.launcher import Cluster
from e2e.cluster.testing import Kubectl
from e2e.tool_venvs import environment

NAMESPACE = "bench-routing"
RATE, SECONDS = 4, 30  # requests per second (constant arrivals) for this long, per side
ISL, OSL = 16, 16  # prompt and output tokens (the model's tokenizer is byte-level)
WARMUP = 8
GOAL_RATIO = 0.5


@dataclass(frozen=True)
class Side:
    ttft_p50_ms: float
    ttft_p99_ms: float
    throughput: float  # completed requests per second
    requests: int
    errors: int
    straggler_share: float = 0.0  # of the requests the pods' own Triton counters saw


def summary(report: dict[str, Any]) -> Side:
    """What P9 reads from aiperf's profile_export_aiperf.json (a metric without samples, such as
    error_request_count with no error, is null there)."""

    def avg(key: str) -> float:
        return float((report.get(key) or {}).get("avg", 0.0))

    ttft = report.get("time_to_first_token") or {}
    return Side(
        ttft_p50_ms=float(ttft.get("p50", 0.0)),
        ttft_p99_ms=float(ttft.get("p99", 0.0)),
        throughput=avg("request_throughput"),
        requests=int(avg("request_count")),
        errors=int(avg("error_request_count")),
    )


def profile(tool: str, ns: str, url: str, tokenizer: Path, out: Path) -> dict[str, Any]:
    """One aiperf run at RATE for SECONDS against url, from inside the network namespace `ns`."""
    argv = [
        tool, "profile", "--model", straggler.MODEL, "--url", url, "--endpoint-type", "completions",
        "--streaming", "--tokenizer", str(tokenizer), "--request-rate", str(RATE),
        "--arrival-pattern", "constant", "--benchmark-duration", str(SECONDS),
        "--benchmark-grace-period", "30", "--warmup-request-count", str(WARMUP),
        "--isl", str(ISL), "--osl", str(OSL), "--use-legacy-max-tokens",
        # A connection per request, as our e2e load does: kube-proxy chooses per connection, so a
        # pooled client would pin its few connections to one or two pods behind the Service.
        "--connection-reuse-strategy", "never",
        "--random-seed", "9", "--ui", "none", "--no-server-metrics", "--no-gpu-telemetry",
        "--artifact-dir", str(out),
    ]  # fmt: skip
    done = subprocess.run(netns.command(ns, argv), capture_output=True, text=True, timeout=SECONDS + 240,
                          check=False)  # fmt: skip
    exported = out / "profile_export_aiperf.json"
    if done.returncode != 0 or not exported.exists():
        raise RuntimeError(f"aiperf failed ({done.returncode}): {(done.stdout + done.stderr)[-3000:]}")
    report: dict[str, Any] = json.loads(exported.read_text())
    return report


def scenario(tool: str, cluster: Cluster, kubectl: Kubectl, tokenizer: Path, out: Path) -> dict[str, Side]:
    """Both sides against the deployment in NAMESPACE, the Service first."""
    ips = straggler.pod_ips(kubectl, NAMESPACE)
    sides: dict[str, Side] = {}
    for side, service in (("Service", straggler.NAME), ("router", straggler.router())):
        url = f"http://{straggler.cluster_ip(kubectl, NAMESPACE, service)}:{OPENAI_PORT}"
        before = straggler.counts(cluster.netns, ips)
        sides[side] = summary(profile(tool, cluster.netns, url, tokenizer, out / side))
        share, _ = straggler.shares(before, straggler.counts(cluster.netns, ips))
        sides[side] = replace(sides[side], straggler_share=share.get(straggler.SLOW_POD, 0.0))
    return sides


def verdict(sides: dict[str, Side]) -> tuple[float, bool]:
    """p99 TTFT router/Service, and whether the goal is met."""
    blind, routed = sides["Service"], sides["router"]
    ratio = routed.ttft_p99_ms / blind.ttft_p99_ms if blind.ttft_p99_ms else float("inf")
    # Both sides are offered the same constant rate: "no lower" allows the 2 % a run's edges make.
    met = (ratio <= GOAL_RATIO and routed.throughput >= blind.throughput * 0.98
           and routed.errors == blind.errors == 0)  # fmt: skip
    return ratio, met


SCENARIOS = (
    ("capacity", straggler.CAPACITY,
     f"every token of every sequence in its batch {straggler.SLOW_STEP_MS} ms slower (less capacity)"),
    ("latency", straggler.LATENCY,
     f"{straggler.SLOW_TTFT_MS} ms before each batch's first token (later, not less capacity)"),
)  # fmt: skip


def run(print_fn: Callable[[str], None] = print) -> None:
    tool = str(environment("bench") / "aiperf")
    with (
        operator_in(NAMESPACE, (18930, 18931), print_fn) as (cluster, kubectl),
        tempfile.TemporaryDirectory() as work,
    ):
        tokenizer = Path(work) / "tokenizer"
        tokenizer_files.write(tokenizer)
        for name, knob, how in SCENARIOS:
            began = time.monotonic()
            straggler.start(kubectl, NAMESPACE, knob)
            sides = scenario(tool, cluster, kubectl, tokenizer, Path(work) / name)
            for side, got in sides.items():
                print_fn(f"routing bench (P9, {name} straggler): through the {side}: TTFT p50 "
                         f"{got.ttft_p50_ms:.0f} ms, p99 {got.ttft_p99_ms:.0f} ms; {got.throughput:.2f} "
                         f"requests/s; {got.requests} requests, {got.errors} errors; straggler's share "
                         f"{got.straggler_share:.2f}")  # fmt: skip
            ratio, met = verdict(sides)
            print_fn(f"routing bench (P9, {name} straggler): p99 TTFT router/Service {ratio:.2f} at {RATE} "
                     f"requests/s for {SECONDS} s, one replica of three slowed: {how} "
                     f"({'within' if met else 'OUTSIDE'} the goal: ratio <= {GOAL_RATIO:g}, throughput no "
                     f"lower, 0 errors)")  # fmt: skip
            straggler.stop(kubectl, NAMESPACE)
            print_fn(f"routing bench (P9, {name} straggler): {time.monotonic() - began:.0f} s, its "
                     "deployment's start and removal included")  # fmt: skip
    print_fn("routing bench (P9): the goal is the capacity straggler's (a slower GPU pool); the latency "
             "straggler's capacity is not lower, so its queue never grows: idle between requests, it "
             "ties with idle healthy replicas on the picker's queue and KV-cache scores and keeps "
             "getting requests, each 1 s late; only a latency signal (GIE's predicted-latency-scorer) "
             "avoids it")  # fmt: skip


if __name__ == "__main__":
    run()
