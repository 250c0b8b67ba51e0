"""A multi-node deployment's launch identity laid out as its pods mount it, and the leader's side of
a launch, for tests that run the real launch agent (runtime/launch_agent.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from llm_operator import contract
from llm_operator.controller.secrets.launch import identities

from e2e.cluster.processes import free_port

__all__ = ["free_port", "launch", "role_dirs", "wait_listening"]

OPERATOR = Path(__file__).resolve().parents[2] / "operator"


def role_dirs(root: Path) -> tuple[Path, Path]:
    """The leader's and the worker's Secret volumes of one new identity: each role only its half,
    0440 as the kubelet writes them."""
    files = identities(datetime.now(UTC))
    dirs = []
    for role, names in (("leader", contract.LEADER_LAUNCH_FILES), ("worker", contract.WORKER_LAUNCH_FILES)):
        d = root / role
        d.mkdir(parents=True)
        for name in names:
            (d / name).write_text(files[name])
            (d / name).chmod(0o440)
        dirs.append(d)
    return dirs[0], dirs[1]


def wait_listening(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"nothing listened on port {port}")


def launch(leader: Path, port: int, command: str, **env: str) -> subprocess.CompletedProcess[str]:
    """What the leader's mpirun does for each worker: run `command` there through its agent."""
    return subprocess.run(
        [sys.executable, "-m", "llm_operator.runtime.launch_agent", "127.0.0.1", command],
        env={
            **os.environ,
            "PYTHONPATH": str(OPERATOR),
            "LLMOP_LAUNCH_IDENTITY_DIR": str(leader),
            "LLMOP_LAUNCH_PORT": str(port),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=30,
    )
