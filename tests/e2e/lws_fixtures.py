"""LeaderWorkerSet's real controller for the module that needs it (test_lws_multi_node.py): LWS
v0.9.0 built from its Go module and installed from its own manifests (e2e/cluster/lws.py) for one
module, removed after it. Import `lws_operator` into the module (module-scoped): LWS installed and
serving its webhooks, then the module's operator started, which renders multi-node replicas as
LeaderWorkerSets because it finds the CRD at start (controller/handlers.py).

LWS is built the first time a test needs it (a warm run only checks the cache).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import lws
from e2e.cluster.components import run_build_tools
from e2e.cluster.state import StateDir
from e2e.cluster.testing import E2ECluster, Kubectl, install, is_true, wait_for

TIMEOUT = 120


def _tools(cluster: E2ECluster) -> dict[str, Path]:
    """LWS's manager (built here the first time, then cached) and the cluster's kubectl."""
    assert cluster.launcher is not None
    found = {k: Path(v) for k, v in StateDir(cluster.launcher.state_dir).meta()["tools"].items()}
    if lws.BINARY not in found:
        found |= run_build_tools(print, groups=("core", "lws"))[0]
    return found


def _probe(namespace: str) -> dict[str, Any]:
    """A LeaderWorkerSet for a server-side dry run: admitted only through LWS's own webhooks."""
    pod = {"containers": [{"name": "c", "image": "localhost/none:dev"}]}
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
        "metadata": {"name": "webhook-probe", "namespace": namespace},
        "spec": {"leaderWorkerTemplate": {"size": 2, "workerTemplate": {"spec": pod}}},
    }  # fmt: skip


def _webhooks_serve(kubectl: Kubectl) -> bool:
    """True once the API server's call of LWS's defaulting webhook comes back (a refused call
    raises, which wait_for reports): the dry run's object then has the rolloutStrategy LWS's
    webhook defaults (pkg/webhooks/leaderworkerset_webhook.go), which its CRD does not."""
    out = kubectl.json("create", "--dry-run=server", "-f", "-", input=json.dumps(_probe(lws.NAMESPACE)))
    return bool(out["spec"].get("rolloutStrategy"))


def _uninstall(kubectl: Kubectl, objects: list[dict[str, Any]]) -> None:
    """Every LeaderWorkerSet while LWS still runs, the webhook configurations (a webhook without its
    server refuses every LWS pod), then LWS's namespace and what it made outside it (RBAC, CRDs)."""
    # check=False: an install that failed before its CRDs has none to delete.
    kubectl("delete", "leaderworkersets", "--all", "--all-namespaces", "--timeout=60s", check=False)
    for kind, name in lws.WEBHOOKS.items():
        kubectl.delete(kind, name)
    kubectl("delete", "namespace", lws.NAMESPACE, "--ignore-not-found", "--wait=false")
    for obj in objects:
        kind, meta = obj["kind"], obj["metadata"]
        if meta.get("namespace") != lws.NAMESPACE and kind != "Namespace" and kind not in lws.WEBHOOKS:
            kubectl.delete(kind, meta["name"], meta.get("namespace"), wait=kind == "CustomResourceDefinition")


@pytest.fixture(scope="module")
def lws_running(cluster: E2ECluster, kubectl: Kubectl) -> Iterator[None]:
    if cluster.launcher is None:
        pytest.skip("needs the embedded cluster's real node to run LWS's manager on")
    if kubectl.get("crd", lws.CRD) is not None:
        pytest.skip("this cluster has a LeaderWorkerSet CRD of its own")
    tools = _tools(cluster)
    start = time.monotonic()
    cluster.launcher.import_image(lws.archive(tools[lws.BINARY], print))
    objects = lws.manifests(tools["kubectl"], tools[lws.BINARY])
    try:
        install(kubectl, objects, "LWS")
        manager = lambda: kubectl.get("deployment", lws.DEPLOYMENT, lws.NAMESPACE)  # noqa: E731
        wait_for(f"{lws.DEPLOYMENT} Available", manager, lambda d: is_true(d, "Available"), timeout=TIMEOUT)
        # Its readiness probe is a ping: the webhooks serve once cert-controller has written the
        # certificate, the kubelet has put it into the pod and the CA is in both configurations.
        wait_for("LWS's webhooks serving the API server", lambda: _webhooks_serve(kubectl), timeout=TIMEOUT)
        print(f"lws: installed and serving its webhooks in {time.monotonic() - start:.1f} s")
        yield
    finally:
        start = time.monotonic()
        _uninstall(kubectl, objects)
        print(f"lws: removed in {time.monotonic() - start:.1f} s")


@pytest.fixture(scope="module")
def lws_operator(request: pytest.FixtureRequest, lws_running: None) -> None:
    """LWS first, then the operator (it decides at start how to render multi-node replicas); torn
    down in the reverse order, so the operator never watches a removed CRD."""
    request.getfixturevalue("operator")
