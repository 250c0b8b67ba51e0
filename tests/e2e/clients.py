"""The clients users bring, each from its own environment from PyPI (scripts/ensure-tool-venv.sh:
requirements/NAME.lock) with the CPU model's tokenizer written locally (nothing from a hub), run
bounded against a deployment's base URL (e2e.chat.base_url of status.endpoints.openai): aiperf,
inference-perf, guidellm and LiteLLM's OpenAI-compatible provider. Each run's verdict is read from
the tool's own report: its count of completed and of failed requests.

The deployments these run against are on the `pytorch` contract, whose engine has no input for
`ignore_eos` (docs/serving-api.md: `true` is refused with a 400): inference-perf's config and
guidellm's backend are told not to send it, as a user of that backend does.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from llm_operator.runtime.cpu_reference import tokenizer_files

from e2e.tool_venvs import ENVIRONMENTS, environment

REQUESTS, CONCURRENCY = 8, 2  # per tool: bounded, a few seconds of the tiny model's time
ISL, OSL = 16, 8  # prompt and output tokens (the tokenizer is byte-level: one token per byte)
RUN_S = 240  # one tool's whole run, its start included


@dataclass
class Run:
    counted: int  # the requests the tool's report counts
    ok: int
    failed: int
    seconds: float
    errors: list[str] = field(default_factory=list)


def _run(argv: list[str], what: str, cwd: Path, **env: str) -> str:
    # Not HF_HUB_OFFLINE: aiperf then looks a local tokenizer directory up in the Hub's cache only.
    env |= {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "HF_HUB_DISABLE_TELEMETRY": "1", "NO_COLOR": "1"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_S, check=False, cwd=cwd, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{what} exited {done.returncode}: {(done.stdout + done.stderr)[-3000:]}")
    return done.stdout


def aiperf(root: str, model: str, tokenizer: Path, out: Path) -> Run:
    """Streamed chat completions at CONCURRENCY; profile_export_aiperf.json's counts (a metric without
    samples, such as error_request_count with no error, is null there)."""
    began = time.monotonic()
    _run([str(environment("bench") / "aiperf"), "profile", "--model", model, "--url", root,
          "--endpoint-type", "chat", "--streaming", "--tokenizer", str(tokenizer),
          "--request-count", str(REQUESTS), "--concurrency", str(CONCURRENCY), "--isl", str(ISL),
          "--osl", str(OSL), "--random-seed", "9", "--ui", "none", "--no-server-metrics",
          "--no-gpu-telemetry", "--artifact-dir", str(out),
          # One worker and one record processor (processes each) do for 2 streams on 2 cores.
          "--workers-max", "1", "--record-processors", "1"], "aiperf", out.parent)  # fmt: skip
    report = json.loads((out / "profile_export_aiperf.json").read_text())

    def count(key: str) -> int:
        return int((report.get(key) or {}).get("avg", 0))

    return Run(REQUESTS, count("request_count"), count("error_request_count"), time.monotonic() - began)


def inference_perf(root: str, model: str, tokenizer: Path, out: Path) -> Run:
    """Streamed completions (its random prompts take no chat), ISL tokens each, REQUESTS at
    CONCURRENCY; the summary report's successes and failures."""
    began = time.monotonic()
    fixed = {"min": 1, "max": 4 * ISL, "std_dev": 0, "type": "fixed"}
    config = {
        "api": {"type": "completion", "streaming": True},
        "data": {"type": "random", "input_distribution": {**fixed, "mean": ISL},
                 "output_distribution": {**fixed, "mean": OSL}},
        "load": {"type": "concurrent", "num_workers": 1,
                 "stages": [{"num_requests": REQUESTS, "concurrency_level": CONCURRENCY}]},
        "server": {"type": "vllm", "model_name": model, "base_url": root, "ignore_eos": False},
        "tokenizer": {"pretrained_model_name_or_path": str(tokenizer)},
        "storage": {"local_storage": {"path": str(out)}},
    }  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yml").write_text(yaml.safe_dump(config))
    _run([str(environment("inference-perf") / "inference-perf"), "--config_file", str(out / "config.yml")],
         "inference-perf", out)  # fmt: skip
    summary = json.loads((out / "summary_lifecycle_metrics.json").read_text())
    failures = summary.get("failures") or {}
    errors = [json.dumps(failures.get("by_label"))] if failures.get("count") else []
    # Its report leaves out one or two of the last requests at times (0.7.0: 6 or 7 of 8 counted, none
    # failed; as many against a closed port, all failed): what it counts is its load summary's count.
    return Run(int((summary.get("load_summary") or {}).get("count", 0)),
               int((summary.get("successes") or {}).get("count", 0)), int(failures.get("count", 0)),
               time.monotonic() - began, errors)  # fmt: skip


def guidellm(root: str, model: str, tokenizer: Path, out: Path) -> Run:
    """Streamed chat completions of synthetic prompts, REQUESTS at CONCURRENCY; the JSON report's
    request totals. For fixed-length outputs it sends ignore_eos: true, which its backend's extra
    body turns back to false (the `pytorch` contract refuses true)."""
    began = time.monotonic()
    scenario = {"spec": {
        "backend": {"kind": "openai_http", "target": root, "model": model,
                    "request_format": "/v1/chat/completions", "extras": {"body": {"ignore_eos": False}}},
        "profile": {"kind": "concurrent", "streams": [CONCURRENCY]},
        "data": [{"kind": "synthetic_text", "prompt_tokens": ISL, "output_tokens": OSL}],
        "tokenizer": {"kind": "huggingface_auto", "model": str(tokenizer)},
        "constraints": [{"kind": "max_requests", "count": REQUESTS}],
        "outputs": [{"kind": "json", "path": str(out / "benchmarks.json")}],
    }}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "scenario.json").write_text(json.dumps(scenario))
    argv = [str(environment("guidellm") / "guidellm"), "run", "--scenario", str(out / "scenario.json"),
            "--disable-console-interactive"]  # fmt: skip
    _run(argv, "guidellm", out, GUIDELLM__MAX_WORKER_PROCESSES="1")  # one process does for 2 streams
    # Its totals leave out the last request at times (0.8.1: still processing when its scheduler ends).
    (benchmark,) = json.loads((out / "benchmarks.json").read_text())["benchmarks"]
    totals = benchmark["metrics"]["request_totals"]
    failed = int(totals["errored"]) + int(totals["incomplete"])
    return Run(int(totals["total"]), int(totals["successful"]), failed, time.monotonic() - began)


def litellm(base: str, model: str, out: Path) -> Run:
    """REQUESTS chat completions each way (sync, streamed, async) and REQUESTS text completions
    (tests/e2e/litellm_run.py, in LiteLLM's environment)."""
    began = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    script = Path(__file__).with_name("litellm_run.py")
    got = json.loads(_run([str(environment("litellm") / "python"), str(script), base, model, str(REQUESTS)],
                          "LiteLLM", out).strip().splitlines()[-1])  # fmt: skip
    took = time.monotonic() - began
    return Run(4 * REQUESTS, int(got["ok"]), int(got["failed"]), took, list(got["errors"]))


def run_all(base: str, model: str, work: Path) -> dict[str, Run]:
    """Every client against `base` (http://HOST:PORT/v1, as the openai SDK takes it), all four at
    once (most of each run is its own start: about 8-12 s each, one after the other), each printed."""
    root = base.removesuffix("/v1")
    tokenizer = work / "tokenizer"
    tokenizer_files.write(tokenizer)
    for name in ENVIRONMENTS:  # created before the clock starts (cached after the first time)
        environment(name)
    began = time.monotonic()
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {
            "aiperf": pool.submit(aiperf, root, model, tokenizer, work / "aiperf"),
            "inference-perf": pool.submit(inference_perf, root, model, tokenizer, work / "inference-perf"),
            "guidellm": pool.submit(guidellm, root, model, tokenizer, work / "guidellm"),
            "LiteLLM": pool.submit(litellm, base, model, work / "litellm"),
        }
        runs = {name: future.result() for name, future in futures.items()}
    for name, got in runs.items():
        print(f"{name}: {got.counted} counted, {got.ok} ok, {got.failed} failed, {got.seconds:.1f} s",
              got.errors[:3], file=sys.stderr)  # fmt: skip
    print(f"the four clients at once: {time.monotonic() - began:.1f} s", file=sys.stderr)
    return runs


def completes_every_run(base: str, model: str, work: Path) -> None:
    """Each client's own report: every request it counts completed, none failed. inference-perf's and
    guidellm's reports count fewer than they were told to send at times (above), never 0."""
    runs = run_all(base, model, work)
    assert {n: (r.ok, r.failed) for n, r in runs.items()} == {n: (r.counted, 0) for n, r in runs.items()}, {
        n: r.errors[:3] for n, r in runs.items()
    }
    assert all(r.counted >= REQUESTS // 2 for r in runs.values()), runs


if __name__ == "__main__":  # scripts/test.sh: every environment, beside the tiers
    for name in ENVIRONMENTS:
        try:
            print(environment(name))
        except RuntimeError as e:  # the tests that need it say so
            print(e, file=sys.stderr)
