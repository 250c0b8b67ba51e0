"""The serving-pod launcher: rank commands for each parallel shape, and process supervision."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from llm_operator.runtime.launcher import PodConfig, command, worker_hosts


def config(**env: str) -> PodConfig:
    return PodConfig.from_env({"LLMOP_MODEL_REPO": "/repo", **env})


def ranks(cmd: list[str]) -> list[list[str]]:
    """Split an MPMD mpirun line into the per-rank tritonserver commands."""
    body = cmd[cmd.index("-n") :]
    segments, current = [], []
    for token in [*body, ":"]:
        if token == ":":
            segments.append(current[2:])  # drop "-n 1"
            current = []
        else:
            current.append(token)
    return segments


def test_cpu_backend_runs_one_tritonserver_without_mpi() -> None:
    cmd = command(config(LLMOP_BACKEND="cpu-reference", LLMOP_HTTP_PORT="9000"))
    assert cmd[0] == "tritonserver"
    assert "--http-port=9000" in cmd and "--allow-gpu-metrics=false" in cmd


def test_tp4_is_one_mpi_world_of_four_with_rank0_serving() -> None:
    cmd = command(config(LLMOP_TP="4", LLMOP_GPUS_PER_POD="4"))
    assert cmd[:2] == ["mpirun", "--allow-run-as-root"]
    per_rank = ranks(cmd)
    assert len(per_rank) == 4
    assert "--http-port=8000" in per_rank[0] and "--allow-metrics=true" in per_rank[0]
    for i, rank in enumerate(per_rank[1:], start=1):
        assert "--allow-http=false" in rank and "--load-model=tensorrt_llm" in rank
        assert f"--backend-config=python,shm-region-prefix-name=rank{i}_" in rank


def test_tp2_pp2_world_size_is_tp_times_pp() -> None:
    assert len(ranks(command(config(LLMOP_TP="2", LLMOP_PP="2", LLMOP_GPUS_PER_POD="4")))) == 4


def test_multi_node_leader_lists_its_workers_and_workers_host_sshd() -> None:
    env = {"LLMOP_TP": "8", "LLMOP_PP": "2", "LLMOP_GPUS_PER_POD": "8", "LLMOP_PODS_PER_REPLICA": "2",
           "LLMOP_GROUP_INDEX": "3",
           "LLMOP_WORKER_HOST_PATTERN": "m-g{group}-{worker}.m-pods.ns.svc"}  # fmt: skip
    leader = config(LLMOP_ROLE="leader", **env)
    assert worker_hosts(leader) == ["m-g3-1.m-pods.ns.svc"]
    cmd = command(leader)
    assert cmd[cmd.index("--host") + 1] == "localhost:8,m-g3-1.m-pods.ns.svc:8"
    assert len(ranks(cmd)) == 16
    assert command(config(LLMOP_ROLE="worker", **env))[0] == "/usr/sbin/sshd"


def fake_server(tmp: Path, body: str) -> Path:
    script = tmp / "fake"
    script.write_text(f"#!{sys.executable}\nimport signal, sys, time, pathlib\n{body}\n")
    script.chmod(0o755)
    return script


def launch(tmp: Path, script: Path) -> subprocess.Popen[bytes]:
    (tmp / "cm").mkdir()
    env = {**os.environ, "LLMOP_BACKEND": "cpu-reference", "LLMOP_TRITONSERVER": str(script),
           "LLMOP_MODEL_REPO_SRC": str(tmp / "cm"), "LLMOP_MODEL_REPO": str(tmp / "repo"),
           "LLMOP_EXIT_TIMEOUT_SECONDS": "1"}  # fmt: skip
    return subprocess.Popen([sys.executable, "-m", "llm_operator.runtime.launcher"], env=env)


def test_sigterm_is_forwarded_and_the_exit_code_kept(tmp_path: Path) -> None:
    marker = tmp_path / "got-sigterm"
    script = fake_server(
        tmp_path,
        f"""
def stop(*_):
    pathlib.Path({str(marker)!r}).write_text("yes")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
pathlib.Path({str(tmp_path / "started")!r}).write_text("")
time.sleep(60)""",
    )
    proc = launch(tmp_path, script)
    deadline = time.monotonic() + 20
    while not (tmp_path / "started").exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    assert marker.read_text() == "yes"


def test_a_dying_server_takes_the_pod_down(tmp_path: Path) -> None:
    proc = launch(tmp_path, fake_server(tmp_path, "sys.exit(3)"))
    assert proc.wait(timeout=20) == 3


def test_a_server_ignoring_sigterm_is_killed_after_the_exit_timeout(tmp_path: Path) -> None:
    script = fake_server(
        tmp_path,
        f"""
signal.signal(signal.SIGTERM, signal.SIG_IGN)
pathlib.Path({str(tmp_path / "started")!r}).write_text("")
time.sleep(60)""",
    )
    proc = launch(tmp_path, script)
    while not (tmp_path / "started").exists():
        time.sleep(0.05)
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGKILL
    assert time.monotonic() - start < 15
