"""A real tritonserver (from the nvidia-pytriton wheel) serving the operator-rendered CPU repository,
started the way a pod starts it: ConfigMap files -> `llm-operator-launch` -> tritonserver."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytriton
from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.modelrepo import render_repository, to_configmap_data
from llm_operator.plan.cpu import cpu_plan

REPO = Path(__file__).resolve().parents[2]
TRITON = Path(pytriton.__file__).parent / "tritonserver"
LIBS = Path(pytriton.__file__).parents[1] / "nvidia_pytriton.libs"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    http: int
    grpc: int
    metrics: int
    log: Path

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/metrics", timeout=5) as r:
            text = r.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def cpu_spec(streaming: bool) -> LLMDeploymentSpec:
    return LLMDeploymentSpec.model_validate({
        "model": {"name": "llm-operator/tiny-llama", "source": {"uri": "builtin://tiny-llama"},
                  "revision": "seed-7"},
        "engine": {"backend": "cpu-reference", "maxBatchSize": 8, "maxInputLen": 64, "maxSeqLen": 256,
                   "maxNumTokens": 256},
        "runtime": {"streaming": streaming, "batching": {"maxQueueDelayMicroseconds": 20000}},
    })  # fmt: skip


def start(tmp: Path, streaming: bool) -> Iterator[Server]:
    if (
        not Path(sysconfig.get_config_var("LIBDIR") or "/", "libpython3.11.so.1.0").exists()
        and not Path("/lib/x86_64-linux-gnu/libpython3.11.so.1.0").exists()
    ):
        pytest.fail("Triton's python stub needs libpython3.11.so.1.0 (Debian package libpython3.11)")
    spec = cpu_spec(streaming)
    cm = tmp / "configmap"
    cm.mkdir()
    for key, text in to_configmap_data(render_repository(spec, cpu_plan(spec).primary, engine_dir="",
                                                         tokenizer_dir="")).items():  # fmt: skip
        (cm / key).write_text(text)
    backends = tmp / "backends"
    shutil.copytree(TRITON / "backends", backends)
    shutil.copy(TRITON / "python_backend_stubs" / "3.11" / "triton_python_backend_stub", backends / "python")
    server = Server(free_port(), free_port(), free_port(), tmp / "triton.log")
    env = {
        **os.environ,
        "LLMOP_BACKEND": "cpu-reference",
        "LLMOP_MODEL_REPO_SRC": str(cm),
        "LLMOP_MODEL_REPO": str(tmp / "repo"),
        "LLMOP_HTTP_PORT": str(server.http),
        "LLMOP_GRPC_PORT": str(server.grpc),
        "LLMOP_METRICS_PORT": str(server.metrics),
        "LLMOP_TRITONSERVER": str(TRITON / "bin" / "tritonserver"),
        "LLMOP_BACKEND_DIR": str(backends),
        "LLMOP_EXIT_TIMEOUT_SECONDS": "5",
        "LLMOP_PYTHONPATH": os.pathsep.join([str(REPO / "operator"), sysconfig.get_paths()["purelib"]]),
        "LD_LIBRARY_PATH": str(LIBS),
    }
    with server.log.open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "llm_operator.runtime.launcher"], env=env, stdout=log,
                                stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"tritonserver exited {proc.returncode}:\n{server.log.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{server.http}/v2/health/ready", timeout=1
                ) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"tritonserver not ready after 60 s:\n{server.log.read_text()[-4000:]}")
            time.sleep(0.3)
        yield server
    finally:
        proc.terminate()  # SIGTERM to the launcher, which forwards it to tritonserver
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="session")
def streaming_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from start(tmp_path_factory.mktemp("triton-stream"), streaming=True)


@pytest.fixture(scope="session")
def batch_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from start(tmp_path_factory.mktemp("triton-batch"), streaming=False)


Probe = Callable[[], float]
