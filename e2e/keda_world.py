"""KEDA's real controller running in the embedded cluster, for whoever needs it for a while (the
keda_running fixture of tests/e2e, bench/zero.py): KEDA v2.21.0 built from its Go module (the first
time, then cached) and installed from its own manifests (e2e/cluster/keda.py), removed afterwards.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from e2e.cluster import keda
from e2e.cluster.components import run_build_tools
from e2e.cluster.launcher import Cluster
from e2e.cluster.state import StateDir
from e2e.cluster.testing import Kubectl, install, is_true, wait_for

TIMEOUT = 90


def _tools(launcher: Cluster, log: Callable[[str], None]) -> dict[str, Path]:
    """KEDA's binaries (built here the first time, then cached) and the cluster's kubectl."""
    found = {k: Path(v) for k, v in StateDir(launcher.state_dir).meta()["tools"].items()}
    if not all(name in found for name in keda.BINARIES):
        found |= run_build_tools(log, groups=("core", "keda"))[0]
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


@contextlib.contextmanager
def running(launcher: Cluster, kubectl: Kubectl, log: Callable[[str], None] = print) -> Iterator[None]:
    """KEDA installed and serving external metrics; every ScaledObject and KEDA removed after."""
    tools = _tools(launcher, log)
    start = time.monotonic()
    for name in keda.BINARIES:
        launcher.import_image(keda.archive(name, tools[name], log))
    objects = keda.manifests(tools["kubectl"], tools["keda-operator"])
    try:
        install(kubectl, objects, "KEDA")
        wait_for("KEDA's Deployments Available",
                 lambda: [kubectl.get("deployment", d, keda.NAMESPACE) for d in keda.DEPLOYMENTS],
                 lambda found: all(is_true(d, "Available") for d in found), timeout=120)  # fmt: skip
        # KEDA's operator writes its CA into the APIService; then the aggregator reaches the adapter.
        wait_for(f"{keda.APISERVICE} Available", lambda: kubectl.get("apiservice", keda.APISERVICE),
                 lambda a: is_true(a, "Available"), timeout=TIMEOUT)  # fmt: skip
        log(f"keda: installed and serving external metrics in {time.monotonic() - start:.1f} s")
        yield
    finally:
        start = time.monotonic()
        _uninstall(kubectl, objects)
        log(f"keda: removed in {time.monotonic() - start:.1f} s")
