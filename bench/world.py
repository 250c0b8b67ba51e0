"""What the real-node benchmarks (P5, P6) stand on: the embedded cluster up, the CRD installed, a
fresh namespace and the operator running in it as a local process, removed afterwards."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from e2e import operator_release
from e2e.cluster import addons
from e2e.cluster.launcher import Cluster
from e2e.cluster.testing import Kubectl, wait_for
from e2e.operator_env import ENV

REPO = Path(__file__).resolve().parents[1]


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@contextlib.contextmanager
def operator_in(
    namespace: str, ports: tuple[int, int], print_fn: Callable[[str], None]
) -> Iterator[tuple[Cluster, Kubectl]]:
    """The operator watching `namespace` (created afresh), its metrics and health on `ports`; its
    log is `<state>/logs/operator-<namespace>.log`. One operator per cluster: a chart install
    (`make operator-up`) is removed first."""
    cluster = Cluster()
    cluster.up(addons=addons.ALL)  # the benches route, analyse and fetch as the tests do
    if operator_release.uninstall(cluster):
        print_fn(f"{namespace}: uninstalled the operator `make operator-up` installed")
    kubectl = Kubectl(cluster.kubeconfig, cluster.bin_dir / "kubectl", timeout=120)
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    kubectl("wait", "--for=condition=Established", "crd/llmdeployments.llmoperator.io", "--timeout=30s")
    kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=true")
    kubectl("create", "namespace", namespace)
    metrics, health = ports
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "LLMOP_METRICS_PORT": str(metrics),
        "LLMOP_HEALTH_PORT": str(health),
        "LLMOP_LOG_LEVEL": "WARNING",
        # The serving pods' images and the metrics peers of their NetworkPolicies, as the tests' operator.
        **ENV,
        # bench/canary.py's analysis queries the test world's Prometheus through its forwarder.
        "LLMOP_ANALYSIS_PROMETHEUS_URLS": cluster.prometheus_url,
    }
    log = (cluster.state_dir / "logs" / f"operator-{namespace}.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "llm_operator.cli", "run", "--namespace", namespace],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for("the operator healthy", lambda: _healthy(health), timeout=60)
        yield cluster, kubectl
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        kubectl("delete", "namespace", namespace, "--wait=false")
