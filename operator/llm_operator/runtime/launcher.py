"""`llm-operator-launch`: the entry point of every serving pod.

It materializes the model repository from the ConfigMap, builds the tritonserver command line for
this pod's ranks, starts it and stays its parent: signals are forwarded, and the pod exits when
Triton exits, so Kubernetes sees and restarts what actually serves (upstream's
launch_triton_server.py Popen's mpirun and returns). `llm-operator-launch drain` is the preStop
hook: it waits for in-flight requests to finish before Kubernetes sends SIGTERM.

Environment (set by the StatefulSet builder, render/serving.py): LLMOP_BACKEND, LLMOP_TP, LLMOP_PP,
LLMOP_GPUS_PER_POD, LLMOP_PODS_PER_REPLICA, LLMOP_MODEL_REPO_SRC, LLMOP_MODEL_REPO,
LLMOP_ENGINE_DIR, LLMOP_{HTTP,GRPC,METRICS}_PORT, LLMOP_EXIT_TIMEOUT_SECONDS; for multi-node
replicas LLMOP_ROLE (leader|worker), LLMOP_GROUP_INDEX, LLMOP_WORKER_HOST_PATTERN (leader; {group}
and {worker} placeholders, workers numbered from 1) and LLMOP_LEADER_HOST (worker). Optional:
LLMOP_TRITONSERVER (binary), LLMOP_BACKEND_DIR, LLMOP_TRTLLM_MODELS_DIR (model.py of the TRT-LLM
pre/postprocessing models in the runtime image).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from llm_operator.modelrepo import materialize

TRTLLM_PYTHON_MODELS = ("preprocessing", "postprocessing")
CPU_MODEL = Path(__file__).with_name("cpu_reference") / "model.py"


@dataclass(frozen=True)
class PodConfig:
    backend: str
    tp: int
    pp: int
    gpus_per_pod: int
    pods_per_replica: int
    repo: str
    engine_dir: str
    http_port: int
    grpc_port: int
    metrics_port: int
    exit_timeout: int
    role: str  # leader | worker
    group: int
    worker_host_pattern: str
    tritonserver: str
    backend_dir: str

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> PodConfig:
        return cls(
            backend=env.get("LLMOP_BACKEND", "tensorrt-engine"),
            tp=int(env.get("LLMOP_TP", "1")),
            pp=int(env.get("LLMOP_PP", "1")),
            gpus_per_pod=int(env.get("LLMOP_GPUS_PER_POD", "1")),
            pods_per_replica=int(env.get("LLMOP_PODS_PER_REPLICA", "1")),
            repo=env.get("LLMOP_MODEL_REPO", "/var/run/llm-operator/model-repo"),
            engine_dir=env.get("LLMOP_ENGINE_DIR", ""),
            http_port=int(env.get("LLMOP_HTTP_PORT", "8000")),
            grpc_port=int(env.get("LLMOP_GRPC_PORT", "8001")),
            metrics_port=int(env.get("LLMOP_METRICS_PORT", "8002")),
            exit_timeout=int(env.get("LLMOP_EXIT_TIMEOUT_SECONDS", "30")),
            role=env.get("LLMOP_ROLE", "leader"),
            group=int(env.get("LLMOP_GROUP_INDEX", "0") or 0),
            worker_host_pattern=env.get("LLMOP_WORKER_HOST_PATTERN", ""),
            tritonserver=env.get("LLMOP_TRITONSERVER", "tritonserver"),
            backend_dir=env.get("LLMOP_BACKEND_DIR", ""),
        )

    @property
    def world_size(self) -> int:
        return self.tp * self.pp


def _serving_flags(c: PodConfig) -> list[str]:
    flags = [
        f"--model-repository={c.repo}",
        f"--http-port={c.http_port}",
        f"--grpc-port={c.grpc_port}",
        f"--metrics-port={c.metrics_port}",
        f"--exit-timeout-secs={c.exit_timeout}",
        "--disable-auto-complete-config",
    ]
    if c.backend_dir:
        flags.append(f"--backend-directory={c.backend_dir}")
    return flags


def rank_command(c: PodConfig, rank: int) -> list[str]:
    """tritonserver for one TensorRT-LLM rank (leader mode: rank 0 serves, the others only load
    tensorrt_llm and join its MPI world)."""
    shm = f"--backend-config=python,shm-region-prefix-name=rank{rank}_"
    if rank == 0:
        return [c.tritonserver, *_serving_flags(c), "--allow-metrics=true", "--allow-gpu-metrics=true",
                "--metrics-interval-ms=1000", shm, f"--id=rank{rank}"]  # fmt: skip
    return [
        c.tritonserver, f"--model-repository={c.repo}", "--model-control-mode=explicit",
        "--load-model=tensorrt_llm", "--allow-http=false", "--allow-grpc=false", "--allow-metrics=false",
        "--disable-auto-complete-config", shm, f"--id=rank{rank}",
    ]  # fmt: skip


def worker_hosts(c: PodConfig) -> list[str]:
    return [c.worker_host_pattern.format(group=c.group, worker=w) for w in range(1, c.pods_per_replica)]


def command(c: PodConfig) -> list[str]:
    """The process this pod runs."""
    if c.backend == "cpu-reference":
        return [c.tritonserver, *_serving_flags(c), "--allow-gpu-metrics=false"]
    if c.role == "worker":
        # Ranks on this pod are started by the leader's mpirun over ssh; this pod hosts sshd.
        return ["/usr/sbin/sshd", "-D", "-e"]
    mpirun = ["mpirun", "--allow-run-as-root", "--bind-to", "none"]
    if c.pods_per_replica > 1:
        hosts = ["localhost", *worker_hosts(c)]
        mpirun += ["--host", ",".join(f"{h}:{c.gpus_per_pod}" for h in hosts)]
    segments: list[list[str]] = []
    for rank in range(c.world_size):
        segments.append(["-n", "1", *rank_command(c, rank)])
    out = mpirun + segments[0]
    for seg in segments[1:]:
        out += [":", *seg]  # one MPMD launch: every rank in one MPI world of size tp*pp
    return out


def python_models(c: PodConfig, env: Mapping[str, str]) -> dict[str, Path]:
    if c.backend == "cpu-reference":
        return {"ensemble": CPU_MODEL}
    base = Path(env.get("LLMOP_TRTLLM_MODELS_DIR", "/app/all_models/inflight_batcher_llm"))
    return {
        m: base / m / "1" / "model.py" for m in TRTLLM_PYTHON_MODELS if (base / m / "1" / "model.py").exists()
    }


def supervise(argv: list[str], exit_timeout: int) -> int:
    """Run argv as our child; forward SIGTERM/SIGINT; exit with its status. If it does not stop
    within the exit timeout after a signal, kill its whole process group."""
    child = subprocess.Popen(argv, start_new_session=True)
    deadline: list[float] = []

    def forward(signum: int, _frame: object) -> None:
        deadline.append(time.monotonic() + exit_timeout + 5)
        os.killpg(child.pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while True:
        try:
            code = child.wait(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            if deadline and time.monotonic() > deadline[0]:
                os.killpg(child.pid, signal.SIGKILL)
    if code < 0:
        return 128 - code  # the shell convention: killed by signal N -> 128+N
    return code


def pending_requests(metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("nv_inference_pending_request_count")
    )


def drain(c: PodConfig, settle_seconds: float = 5.0) -> int:
    """preStop: let endpoint removal propagate, then wait until nothing is in flight (bounded)."""
    time.sleep(settle_seconds)
    deadline = time.monotonic() + c.exit_timeout
    while time.monotonic() < deadline:
        try:
            if pending_requests(c.metrics_port) == 0:
                return 0
        except OSError:
            return 0  # not serving: nothing to drain
        time.sleep(0.5)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    c = PodConfig.from_env(os.environ)
    if args[:1] == ["drain"]:
        return drain(c)
    # Every pod materializes: ranks on worker pods load tensorrt_llm from the same path.
    src = os.environ.get("LLMOP_MODEL_REPO_SRC", "/etc/llm-operator/model-repo")
    materialize(src, c.repo, python_models(c, os.environ))
    cmd = command(c)
    print("llm-operator-launch:", " ".join(cmd), flush=True)
    return supervise(cmd, c.exit_timeout)


if __name__ == "__main__":
    sys.exit(main())
