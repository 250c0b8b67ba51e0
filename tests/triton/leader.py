"""A leader pod's processes on this machine: llm-operator-launch with the environment the operator
renders for a cpu-reference leader, starting the CPU runtime's real tritonserver and the OpenAI
front door beside it. Used by tests/triton/test_frontdoor.py and bench/frontdoor.py (P8)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.frontdoor.tokenizer import Tokenizer
from llm_operator.modelrepo import render_repository, speaks_llmapi, to_configmap_data
from llm_operator.plan.cpu import cpu_plan
from llm_operator.runtime.cpu_reference import tokenizer_files
from prometheus_client.parser import text_string_to_metric_families

from e2e.cluster.processes import free_ports
from tests.triton.server import TritonInstall

REPO = Path(__file__).resolve().parents[2]


@dataclass
class LeaderPod:
    process: subprocess.Popen[bytes]
    log: Path
    http_port: int  # Triton's /v2
    openai_port: int
    metrics_port: int
    tokenizer: Tokenizer

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.openai_port}/v1"

    def output_tokens(self) -> float:
        """Tokens the front door's model (tensorrt_llm, on either contract) decoded so far (its
        nv_llm_output_token_len histogram's sum)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
        samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
        name = "nv_llm_output_token_len_sum"
        return sum(s.value for s in samples if s.name == name and s.labels.get("model") == "tensorrt_llm")


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@contextlib.contextmanager
def leader_pod(
    work: Path, spec: LLMDeploymentSpec, names: tuple[str, ...], model_dir: Path | None = None
) -> Iterator[LeaderPod]:
    """Ready when Triton's model and the front door both answer; stopped with SIGTERM, as the
    kubelet stops a pod. Raises RuntimeError (with the log's tail) if it does not become ready or
    does not stop with status 0. model_dir: a mounted model's directory (LLMOP_MODEL_DIR), which is
    also its tokenizer's."""
    configmap = work / "configmap"
    configmap.mkdir()
    python_path = (str(REPO / "operator"), sysconfig.get_paths()["purelib"])
    files = render_repository(spec, cpu_plan(spec).primary, engine_dir="", tokenizer_dir="",
                              python_path=python_path)  # fmt: skip
    for key, text in to_configmap_data(files).items():
        (configmap / key).write_text(text)
    tokenizer = model_dir or work / "tokenizer"
    if model_dir is None:
        tokenizer_files.write(tokenizer)
    install = TritonInstall.from_wheel()
    http, grpc, metrics, api = free_ports(4)
    max_seq_len = spec.engine.max_seq_len
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), os.environ.get("PYTHONPATH", "")]),
        "LD_LIBRARY_PATH": str(install.libraries),
        "LLMOP_BACKEND": "cpu-reference",
        **({"LLMOP_CONTRACT": "pytorch"} if speaks_llmapi(spec) else {}),
        "LLMOP_GPUS_PER_POD": "0",
        "LLMOP_TRITONSERVER": str(install.binary),
        "LLMOP_BACKEND_DIR": str(install.backends(work / "backends")),
        "LLMOP_MODEL_REPO_SRC": str(configmap),
        "LLMOP_MODEL_REPO": str(work / "repo"),
        "LLMOP_TOKENIZER_DIR": str(tokenizer),
        **({"LLMOP_MODEL_DIR": str(model_dir)} if model_dir else {}),
        "LLMOP_HTTP_PORT": str(http),
        "LLMOP_GRPC_PORT": str(grpc),
        "LLMOP_METRICS_PORT": str(metrics),
        "LLMOP_OPENAI_PORT": str(api),
        "LLMOP_SERVED_MODEL_NAMES": ",".join(names),
        "LLMOP_MAX_INPUT_LEN": str(min(spec.engine.max_input_len, max_seq_len)),
        "LLMOP_MAX_SEQ_LEN": str(max_seq_len),
        "LLMOP_EXIT_TIMEOUT_SECONDS": "5",
        "LLMOP_RUNTIME_DIR": str(work / "run"),
        "LLMOP_TERMINATION_LOG": str(work / "termination-log"),
    }
    log = work / "pod.log"
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "llm_operator.runtime.launcher"], env=env,
                                   stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    pod = LeaderPod(process, log, http, api, metrics, Tokenizer.load(tokenizer))
    deadline = time.monotonic() + 120
    while not (_ready(f"http://127.0.0.1:{http}/v2/health/ready") and _ready(f"{pod.base_url}/models")):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise RuntimeError(f"the pod did not become ready:\n{log.read_text()[-4000:]}")
        time.sleep(0.25)
    try:
        yield pod
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
    # A requested stop ends with 0: Triton drained, then the front door stopped.
    if code != 0:
        raise RuntimeError(f"the pod stopped with status {code}:\n{log.read_text()[-4000:]}")
