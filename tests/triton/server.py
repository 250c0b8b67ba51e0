"""A real tritonserver on CPU, from the nvidia-pytriton wheel (a dev dependency): how the Triton
tests run the CPU reference runtime without a cluster or a GPU.

The wheel ships the server, its libraries and python-backend stubs for several CPython versions; the
stub matching the interpreter is copied into a private backend directory rather than into
site-packages, so the installed wheel is never modified. The stub embeds the system libpython
(Debian: libpython3.11), which is why the CPU repository carries its own sys.path (python_path).
"""

from __future__ import annotations

import contextlib
import ctypes.util
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytriton
from llm_operator.runtime.commands import METRICS_CONFIG
from prometheus_client.parser import text_string_to_metric_families

from e2e.cluster.processes import free_port


@dataclass(frozen=True)
class TritonInstall:
    root: Path  # .../site-packages/pytriton/tritonserver

    @classmethod
    def from_wheel(cls) -> TritonInstall:
        return cls(Path(pytriton.__file__).parent / "tritonserver")

    @property
    def binary(self) -> Path:
        return self.root / "bin" / "tritonserver"

    @property
    def libraries(self) -> Path:
        return self.root.parents[1] / "nvidia_pytriton.libs"

    def backends(self, dest: Path) -> Path:
        """A backend directory whose python backend has the stub for this interpreter's version."""
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        if ctypes.util.find_library(f"python{version}") is None:
            raise RuntimeError(f"Triton's python stub needs the system libpython{version} (Debian package)")
        shutil.copytree(self.root / "backends", dest)
        stub = self.root / "python_backend_stubs" / version / "triton_python_backend_stub"
        shutil.copy2(stub, dest / "python")
        return dest


def parse_metrics(text: str, model: str | None = None) -> dict[str, float]:
    """Prometheus text -> metric name -> sum over its series (only `model`'s, when given). Keyed by
    family, as Triton writes the name (the parser renames counter samples <name>_total): Triton
    exports counters and gauges, one metric per family (histograms only when configured).
    """
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if model is None or sample.labels.get("model") == model:
                out[family.name] = out.get(family.name, 0.0) + sample.value
    return out


@dataclass
class TritonProcess:
    """tritonserver serving `repo`, started with the flags a CPU serving pod uses."""

    repo: Path
    workdir: Path  # backends and the log go here
    install: TritonInstall = field(default_factory=TritonInstall.from_wheel)
    http_port: int = field(default_factory=free_port)
    grpc_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    exit_timeout_seconds: int = 5
    env: dict[str, str] = field(default_factory=dict)  # on top of this process's environment
    launch: list[str] = field(default_factory=list)  # what starts the server (mpirun ...), if anything
    process: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.workdir / "tritonserver.log"

    def command(self, backends: Path) -> list[str]:
        return [
            *self.launch,
            str(self.install.binary),
            f"--model-repository={self.repo}",
            f"--backend-directory={backends}",
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            "--allow-gpu-metrics=false",
            *METRICS_CONFIG,
            "--disable-auto-complete-config",
            f"--exit-timeout-secs={self.exit_timeout_seconds}",
            # Python stubs talk to the server through /dev/shm regions: unique per server on one host.
            f"--backend-config=python,shm-region-prefix-name=llmop{self.http_port}_",
        ]

    def start(self, ready_timeout: float = 120.0) -> None:
        backends = self.install.backends(self.workdir / "backends")
        env = {**os.environ, **self.env}
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(self.install.libraries), env.get("LD_LIBRARY_PATH", "")) if p
        )
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                self.command(backends), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + ready_timeout
        while not self.ready():
            if self.process.poll() is not None:
                raise RuntimeError(f"tritonserver exited {self.process.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"tritonserver not ready after {ready_timeout:.0f} s:\n{self.log_tail()}")
            time.sleep(0.25)

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/v2/health/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def metrics(self, model: str | None = None) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return parse_metrics(r.read().decode(), model)

    def log_tail(self, chars: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def stop(self) -> int | None:
        """SIGTERM (Triton drains in-flight requests), then SIGKILL to the whole group (its stubs)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=self.exit_timeout_seconds + 10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        with contextlib.suppress(ProcessLookupError):  # stubs left behind by a crashed server
            os.killpg(self.process.pid, signal.SIGKILL)
        return self.process.returncode
