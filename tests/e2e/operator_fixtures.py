"""Fixtures for tests of the operator itself: the CRD installed, the operator running as a process.

The operator runs exactly as `llm-operator run` would outside the cluster (same entry point, the
session's kubeconfig), so these tests work against the embedded cluster and against kind alike.
`OperatorProcess` is that process for tests that start, kill or pause operators themselves.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from llm_operator.render.autoscaling import DEFAULT_PROMETHEUS_URL

from e2e.cluster.processes import Children, free_ports
from e2e.cluster.testing import E2ECluster, Kubectl, is_true, wait_for
from e2e.operator_env import ENV
from tests.e2e import streams

REPO = Path(__file__).resolve().parents[2]
# Namespaces of modules marked `own_operator` begin so: their own operators watch them, and the
# streams' shared operator leaves them alone (tests/e2e/streams.py).
OWN_NAMESPACES = "e2e-own-"


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


def analysis_endpoints(cluster: E2ECluster) -> list[str]:
    """The Prometheus endpoints canary analysis may query: the in-cluster one the chart allows by
    default and, on the embedded cluster, its forwarder on 127.0.0.1 (how this host reaches it)."""
    urls = [DEFAULT_PROMETHEUS_URL]
    if cluster.launcher is not None:
        urls.append(cluster.launcher.prometheus_url)
    return urls


class OperatorProcess:
    """`llm-operator run ARGS` as a local process, its output appended to `log_path`; started at once."""

    def __init__(
        self, cluster: E2ECluster, log_path: Path, args: Sequence[str] = ("--all-namespaces",), **env: str
    ) -> None:
        self.log_path, self.argv = log_path, [sys.executable, "-m", "llm_operator.cli", "run", *args]
        self.env = {
            **os.environ,
            "KUBECONFIG": str(cluster.kubeconfig),
            "LLMOP_LOG_LEVEL": "INFO",
            **ENV,
            "LLMOP_ANALYSIS_PROMETHEUS_URLS": " ".join(analysis_endpoints(cluster)),
            **env,
        }
        self.start()

    def start(self) -> None:
        """Ports picked again at each start: one kept across restarts can be taken meanwhile by any
        client's connection (its port, ESTABLISHED or in TIME_WAIT, refuses the bind even with
        SO_REUSEADDR), and the operator then exits at once."""
        self.health, self.metrics_port = free_ports(2)
        self.env |= {"LLMOP_HEALTH_PORT": str(self.health), "LLMOP_METRICS_PORT": str(self.metrics_port)}
        with self.log_path.open("a") as log:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO
            )

    def running(self) -> None:
        """Fails the test at once, with the log's tail, when the process has exited."""
        if self.proc.poll() is not None:  # no point waiting: show why it died
            pytest.fail(f"operator exited {self.proc.returncode}:\n{self.log()[-3000:]}", pytrace=False)

    def healthy(self) -> bool:
        self.running()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health}/healthz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def wait_healthy(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if time.monotonic() > deadline:
                pytest.fail(
                    f"operator not healthy after {timeout:.0f} s:\n{self.log()[-3000:]}", pytrace=False
                )
            time.sleep(0.5)

    def log(self, start: int = 0) -> str:
        with self.log_path.open("rb") as f:
            f.seek(start)
            return f.read().decode(errors="replace")

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return str(r.read().decode())

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        """SIGTERM (resuming it first if it was stopped), SIGKILL after 20 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


def sample(text: str, name: str, **labels: str) -> float:
    """Sum of a metric's samples whose labels include `labels` (0 when there are none)."""
    total = 0.0
    for m in re.finditer(rf"^{name}(?:\{{([^}}]*)\}})? (\S+)$", text, re.M):
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if labels.items() <= have.items():
            total += float(m.group(2))
    return total


@pytest.fixture(scope="module")
def own_namespaces() -> str:
    """What `namespace` prefixes the names of a module marked `own_operator` with (`own-<token>`:
    the namespaces are `e2e-own-<token>-...`), the ones its `operator_process` alone watches."""
    return f"{OWN_NAMESPACES.removeprefix('e2e-')}{secrets.token_hex(3)}"


# Module scope: the operator stops when the module's tests are done, so a test module that runs
# its own operators (HA, faults) never shares a namespace with this one.
@pytest.fixture(scope="module")
def operator_process(
    request: pytest.FixtureRequest,
    crd: None,
    cluster: E2ECluster,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    """`llm-operator run` against the session cluster, watching every namespace, or in a module
    marked `own_operator` only the module's; its log is printed if it dies."""
    scope: tuple[str, ...] = ("--all-namespaces",)
    if request.node.get_closest_marker("own_operator") is not None:
        scope = ("--namespace", f"e2e-{request.getfixturevalue('own_namespaces')}-*")
    op = OperatorProcess(cluster, tmp_path_factory.mktemp("operator") / "operator.log", scope)
    try:
        op.wait_healthy()
        yield op
    finally:
        op.stop()
        if op.proc.returncode not in (0, -15):
            print(f"operator log ({op.log_path}):\n{op.log()[-5000:]}")


def shared_operator(cluster: E2ECluster, directory: Path) -> None:
    """The one operator of a run in streams (tests/e2e/streams.py): started by the first worker
    that needs it, checked healthy by every module after; the xdist controller stops it."""
    state = directory / "operator.json"
    with (directory / "operator.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not state.exists():
            op = OperatorProcess(cluster, directory / "operator.log", ("--namespace", f"!{OWN_NAMESPACES}*"))
            op.wait_healthy()
            state.write_text(json.dumps({"pid": op.proc.pid, "health": op.health}))
            return
    health = json.loads(state.read_text())["health"]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=10) as r:
            assert r.status == 200
    except (OSError, AssertionError) as e:
        log = (directory / "operator.log").read_text(errors="replace")[-3000:]
        pytest.fail(f"the streams' shared operator is not healthy ({e}):\n{log}", pytrace=False)


def stop_shared_operator(directory: Path) -> None:
    """SIGTERM the run's shared operator (SIGKILL after 20 s), if one was started."""
    state = directory / "operator.json"
    if state.exists():
        Children().terminate([json.loads(state.read_text())["pid"]], timeout=20)


@pytest.fixture(scope="module")
def operator(request: pytest.FixtureRequest, crd: None, cluster: E2ECluster) -> None:
    """An operator is running (tests that only need it to act): the module's own, or in a run in
    streams the run's shared one."""
    if streams.in_a_stream():
        shared_operator(cluster, Path(os.environ[streams.SHARED_OPERATOR_DIR]))
    else:
        request.getfixturevalue("operator_process")
