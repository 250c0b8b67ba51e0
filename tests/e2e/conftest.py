"""Fixtures for e2e tests (mark them @pytest.mark.e2e). Helpers live in e2e/cluster/testing.py.

Cluster choice: the embedded control plane (.cluster/), started on first use, unless KUBECONFIG
names another kubeconfig file, e.g. `KUBECONFIG=~/.kube/kind make test`: that cluster is used as it is,
without fake GPU nodes (tests needing them should skip, see `cluster.gpu_nodes()`). Concurrent
sessions share the embedded cluster; the last one to finish stops it, unless it was started by
`make cluster-up`, which keeps it up until `make cluster-down`.

Fixtures:
- state_dir (function) -> Path: a short path for a second cluster's state directory
- prometheus (function) -> str: the test world's Prometheus URL as a host process reaches it
- cluster (session) -> E2ECluster: .kubeconfig, .kubectl, .embedded, .gpu_nodes(product=None)
- kubeconfig (session) -> Path of the admin kubeconfig
- kubectl (session) -> Kubectl: kubectl(*args), .json(), .get(), .items(), .apply(), .delete(),
  .events(), .create_namespace()
- keda_running (module) -> None: KEDA's controller installed for the module (keda_fixtures.py)
- lws_running, lws_operator (module) -> None: LeaderWorkerSet's controller installed for the
  module, then the module's operator started (lws_fixtures.py)
- namespace (function) -> str: a fresh namespace (default ServiceAccount ready, Pod Security
  restricted enforced unless the test is marked pod_security(LEVEL)), deleted after the test
  without waiting
Waiting: `from e2e.cluster.testing import wait_for, pod_ready, condition, is_true`.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.cluster import ClusterError
from e2e.cluster.testing import E2ECluster, Kubectl
from tests.e2e import streams


@pytest.fixture(scope="session")
def cluster() -> Iterator[E2ECluster]:
    try:
        handle = E2ECluster.for_session()
    except (ClusterError, FileNotFoundError) as e:
        pytest.fail(f"e2e cluster unavailable: {e}", pytrace=False)
    yield handle
    handle.finish()


@pytest.fixture(scope="session")
def kubeconfig(cluster: E2ECluster) -> Path:
    return cluster.kubeconfig


@pytest.fixture(scope="session")
def kubectl(cluster: E2ECluster) -> Kubectl:
    return cluster.kubectl


@pytest.fixture
def namespace(kubectl: Kubectl, request: pytest.FixtureRequest) -> Iterator[str]:
    """Pod Security `restricted` is enforced there; a test whose own pods need less says so with
    @pytest.mark.pod_security("baseline" or "privileged") and why."""
    marker = request.node.get_closest_marker("pod_security")
    hint = request.node.name
    if request.node.get_closest_marker("own_operator") is not None:  # its operator's alone
        hint = f"{request.getfixturevalue('own_namespaces')}-{hint}"
    name = kubectl.create_namespace(hint, *(marker.args if marker else ()))
    yield name
    kubectl.delete("namespace", name)


@pytest.fixture
def embedded(cluster: E2ECluster) -> E2ECluster:
    """For tests on the embedded cluster's real node and monitoring stack (not kind or a real cluster)."""
    if cluster.launcher is None:
        pytest.skip("needs the embedded cluster's real node and monitoring stack")
    return cluster


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A directory for a second cluster's state, short enough for its kubelet's unix sockets (108
    bytes at most), which tmp_path under pytest-xdist (.../popen-gw0/test_...) is not. Removed
    after the test."""
    directory = Path(tempfile.mkdtemp(prefix="llmop-", dir="/tmp"))
    yield directory / "state"
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def prometheus(embedded: E2ECluster) -> str:
    """The test world's Prometheus as the operator (a process on this host) reaches it."""
    assert embedded.launcher is not None
    return str(embedded.launcher.prometheus_url)


@pytest.fixture
def gpu_pools(cluster: E2ECluster) -> None:
    """For tests that place on the simulated GPU node pools (absent from kind or a real cluster)."""
    if not cluster.gpu_nodes():
        pytest.skip("this cluster has no simulated GPU node pools")


@pytest.hookimpl(trylast=True)  # after `-m` has deselected
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if streams.in_a_stream():
        streams.refuse_exclusive(items)


# Operator fixtures (crd, operator) live beside the tests that use them.
from tests.e2e.keda_fixtures import keda_running  # noqa: E402, F401
from tests.e2e.lws_fixtures import lws_operator, lws_running  # noqa: E402, F401
from tests.e2e.operator_fixtures import crd, operator, operator_process, own_namespaces  # noqa: E402, F401
