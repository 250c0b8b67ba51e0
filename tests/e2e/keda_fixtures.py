"""KEDA's real controller for the modules that need it (test_keda.py, test_scale_to_zero.py): KEDA
v2.21.0 built from its Go module and installed from its own manifests (e2e/cluster/keda.py) for one
module, removed after it. Import `keda_running` into the module (a module-scoped fixture).

KEDA is built the first time a test needs it (a warm run only checks the cache).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import keda
from e2e.cluster.components import run_build_tools
from e2e.cluster.state import StateDir
from e2e.cluster.testing import E2ECluster, Kubectl, install, is_true, wait_for

TIMEOUT = 90


def _tools(cluster: E2ECluster) -> dict[str, Path]:
    """KEDA's binaries (built here the first time, then cached) and the cluster's kubectl."""
    assert cluster.launcher is not None
    found = {k: Path(v) for k, v in StateDir(cluster.launcher.state_dir).meta()["tools"].items()}
    if not all(name in found for name in keda.BINARIES):
        found |= run_build_tools(print, groups=("core", "keda"))[0]
    return found


def _uninstall(kubectl: Kubectl, objects: list[dict[str, Any]]) -> None:
    """Every ScaledObject while KEDA still runs (it holds them with a finalizer, and so the CRD),
    the APIService (an aggregated API without its server breaks discovery), then KEDA's namespace
    and what it made outside it (RBAC, the CRDs)."""
    # check=False: an install that failed before its CRDs has none to delete.
    kubectl("delete", "scaledobjects", "--all", "--all-namespaces", "--timeout=60s", check=False)
    kubectl.delete("apiservice", keda.APISERVICE)
    kubectl("delete", "namespace", keda.NAMESPACE, "--ignore-not-found", "--wait=false")
    for obj in objects:
        kind, meta = obj["kind"], obj["metadata"]
        if meta.get("namespace") != keda.NAMESPACE and kind not in ("Namespace", "APIService"):
            kubectl.delete(kind, meta["name"], meta.get("namespace"), wait=kind == "CustomResourceDefinition")


@pytest.fixture(scope="module")
def keda_running(cluster: E2ECluster, kubectl: Kubectl) -> Iterator[None]:
    if cluster.launcher is None:
        pytest.skip("needs the embedded cluster's real node and monitoring stack")
    tools = _tools(cluster)
    start = time.monotonic()
    for name in keda.BINARIES:
        cluster.launcher.import_image(keda.archive(name, tools[name], print))
    objects = keda.manifests(tools["kubectl"], tools["keda-operator"])
    try:
        install(kubectl, objects, "KEDA")
        wait_for("KEDA's Deployments Available",
                 lambda: [kubectl.get("deployment", d, keda.NAMESPACE) for d in keda.DEPLOYMENTS],
                 lambda found: all(is_true(d, "Available") for d in found), timeout=120)  # fmt: skip
        # KEDA's operator writes its CA into the APIService; then the aggregator reaches the adapter.
        wait_for(f"{keda.APISERVICE} Available", lambda: kubectl.get("apiservice", keda.APISERVICE),
                 lambda a: is_true(a, "Available"), timeout=TIMEOUT)  # fmt: skip
        print(f"keda: installed and serving external metrics in {time.monotonic() - start:.1f} s")
        yield
    finally:
        start = time.monotonic()
        _uninstall(kubectl, objects)
        print(f"keda: removed in {time.monotonic() - start:.1f} s")
