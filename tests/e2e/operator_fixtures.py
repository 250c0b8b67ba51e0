"""Fixtures for tests of the operator itself: the CRD installed, the operator running as a process.

The operator runs exactly as `llm-operator run` would outside the cluster (same entry point, the
session's kubeconfig), so these tests work against the embedded cluster and against kind alike.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.cluster.processes import free_port
from e2e.cluster.testing import E2ECluster, Kubectl, is_true, wait_for

REPO = Path(__file__).resolve().parents[2]
# cpu-reference serving pods run this image on the embedded cluster's real node, which has it
# imported at `up` (images.builder); a `:dev` tag means imagePullPolicy IfNotPresent.
CPU_RUNTIME_IMAGE = "localhost/llm-operator/cpu-runtime:dev"


@pytest.fixture(scope="session")
def crd(kubectl: Kubectl) -> None:
    """The generated CRD, applied server-side (as `make demo` and the chart do)."""
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    # Polled rather than `kubectl wait`, which fails outright while a new CRD has no conditions yet.
    wait_for(
        "the LLMDeployment CRD Established",
        lambda: kubectl.get("crd", "llmdeployments.llmoperator.io"),
        lambda c: is_true(c, "Established"),
    )


def operator_log_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.getbasetemp() / "operator.log"


@pytest.fixture
def operator_log(operator: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session operator's log (stdout and stderr)."""
    return operator_log_path(tmp_path_factory)


@pytest.fixture(scope="session")
def operator(crd: None, cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """`llm-operator run` against the session cluster; its log is printed if it dies."""
    log_path = operator_log_path(tmp_path_factory)
    health, metrics = free_port(), free_port()
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "LLMOP_HEALTH_PORT": str(health),
        "LLMOP_METRICS_PORT": str(metrics),
        "LLMOP_LOG_LEVEL": "INFO",
        "LLMOP_CPU_RUNTIME_IMAGE": CPU_RUNTIME_IMAGE,
    }
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "llm_operator.cli", "run", "--all-namespaces"],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
        )  # fmt: skip

    def healthy() -> bool:
        if proc.poll() is not None:  # no point waiting: show why it died
            pytest.fail(f"operator exited {proc.returncode}:\n{log_path.read_text()[-3000:]}", pytrace=False)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    try:
        deadline = time.monotonic() + 60
        while not healthy():
            if time.monotonic() > deadline:
                pytest.fail(
                    f"operator not healthy after 60 s:\n{log_path.read_text()[-3000:]}", pytrace=False
                )
            time.sleep(0.5)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        if proc.returncode not in (0, -15):
            print(f"operator log ({log_path}):\n{log_path.read_text()[-5000:]}")
