"""The xdist controller's side of the e2e streams (tests/e2e/streams.py): which tests go together
to one worker, a directory for the run's shared operator made before the workers start (they
inherit it in their environment), and that operator stopped once they are done. Without `-n`
nothing happens here."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import streams

SHARED_DIR = pytest.StashKey[Path]()
FAILED = pytest.StashKey[bool]()


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", default=None):
        return
    directory = Path(tempfile.mkdtemp(prefix="llmop-e2e-streams-"))
    config.stash[SHARED_DIR] = directory
    os.environ[streams.SHARED_OPERATOR_DIR] = str(directory)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Whole scopes to a worker, largest first. Not `--dist loadgroup`: its xdist_group marks are
    lost on pytest 9.2 (pytest-dev/pytest-xdist#1386), and tests would be split across workers."""
    from xdist.scheduler import LoadScopeScheduling

    class ByScope(LoadScopeScheduling):  # type: ignore[misc]  # pytest-xdist ships no type information
        def _split_scope(self, nodeid: str) -> str:
            return streams.scope(nodeid)

    return ByScope(config, log)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[FAILED] = exitstatus != 0


def pytest_unconfigure(config: pytest.Config) -> None:
    directory = config.stash.get(SHARED_DIR, None)
    if directory is None:
        return
    from tests.e2e.operator_fixtures import stop_shared_operator  # the operator's code only when used

    stop_shared_operator(directory)
    log = directory / "operator.log"
    if config.stash.get(FAILED, True) or (
        "Traceback" in log.read_text(errors="replace") if log.exists() else False
    ):
        print(f"\nthe streams' shared operator log is kept: {log}")
    else:
        shutil.rmtree(directory, ignore_errors=True)
