"""KEDA's real controller for the modules that need it (test_keda.py, test_scale_to_zero.py): KEDA
v2.21.0 built from its Go module and installed from its own manifests (e2e/keda_world.py) for one
module, removed after it. Import `keda_running` into the module (a module-scoped fixture).

KEDA is built the first time a test needs it (a warm run only checks the cache).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from e2e import keda_world
from e2e.cluster.testing import E2ECluster, Kubectl


@pytest.fixture(scope="module")
def keda_running(cluster: E2ECluster, kubectl: Kubectl) -> Iterator[None]:
    if cluster.launcher is None:
        pytest.skip("needs the embedded cluster's real node and monitoring stack")
    with keda_world.running(cluster.launcher, kubectl):
        yield
