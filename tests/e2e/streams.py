"""The e2e tier in two streams (scripts/test.sh, or `pytest -m "e2e and not exclusive" -n 2`).

Most e2e modules keep to namespaces of their own, and they mostly wait (pods starting, analysis
windows, HPA syncs), so two pytest-xdist workers run them side by side against one cluster and one
operator (operator_fixtures.shared_operator: two operators watching every namespace would both act
on each deployment). A worker takes a whole module at a time (tests/conftest.py's scheduler asks
`scope`), so module-scoped fixtures are built once. The modules that place pods on the simulated
GPU pools are one scope, run one after another: the pools are small (two A10G GPUs), and their
tests expect the GPUs they ask for to be free. Modules marked `exclusive` need the cluster to
themselves: they run alone, before the streams, each with an operator of its own. Modules marked
`own_operator` stop, kill or restart an operator of their own: it watches only their namespaces
(e2e-own-*, operator_fixtures.own_namespaces), which the shared operator leaves alone (`--namespace
'!e2e-own-*'`), so they run in the streams too.
"""

from __future__ import annotations

import os
from pathlib import PurePosixPath

import pytest

# Modules that place pods on the simulated GPU pools: one scope, so they run one after another.
SIMULATED_GPU_POOLS = "simulated-gpu-pools"
SIMULATED_GPU_POOL_MODULES = frozenset(
    f"test_{name}.py"
    for name in (
        "admission", "cluster", "cluster_knowledge", "gitops", "monitoring_stack", "operator",
        "placement", "random_specs", "launch_identity_volume",
    )
)  # fmt: skip
# The directory the xdist controller made for this run's shared operator; set only in its workers.
SHARED_OPERATOR_DIR = "LLMOP_E2E_SHARED_OPERATOR_DIR"


def in_a_stream() -> bool:
    """This process is one of the streams (an xdist worker of a run that shares one operator)."""
    return bool(os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get(SHARED_OPERATOR_DIR))


def scope(nodeid: str) -> str:
    """The unit a stream takes whole: a test's module, or SIMULATED_GPU_POOLS."""
    module = nodeid.split("::", 1)[0]
    return SIMULATED_GPU_POOLS if PurePosixPath(module).name in SIMULATED_GPU_POOL_MODULES else module


def refuse_exclusive(items: list[pytest.Item]) -> None:
    """Exclusive modules would restart or duplicate what the other stream relies on."""
    for item in items:
        if item.get_closest_marker("e2e") is not None and item.get_closest_marker("exclusive") is not None:
            raise pytest.UsageError(
                f"{item.nodeid} is marked exclusive: it needs the cluster to itself, so run it "
                'without -n (scripts/test.sh runs `-m "e2e and exclusive"` before the streams)'
            )
