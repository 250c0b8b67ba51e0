"""mpirun's report of the member that ended a world, read as one line naming the rank and its pod
(runtime/mpi_report.py): from Open MPI 4.1's words, and from a real mpirun whose rank is killed or
exits non-zero (skipped where Open MPI is not installed)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from llm_operator.runtime.commands import rank_places
from llm_operator.runtime.config import PodConfig
from llm_operator.runtime.mpi_report import MpiReport

from tests.unit.launch_identities import OPERATOR, role_dirs

PLACES = ("lead-0", "lead-g0-1.pods.ns.svc")


def read(text: str, places: tuple[str, ...] = PLACES) -> list[str]:
    report = MpiReport(places)
    return [said for line in text.splitlines() if (said := report.feed(line))]


def test_a_rank_killed_by_a_signal() -> None:
    text = ("-----\nmpirun noticed that process rank 1 with PID 0 on node lead-g0-1.pods.ns.svc exited on "
            "signal 15 (Terminated).\n-----")  # fmt: skip
    assert read(text) == ["mpirun: rank 1 on lead-g0-1.pods.ns.svc exited on signal 15 (Terminated)"]
    assert read("mpirun noticed that process rank 3 with PID 9 on node w exited on signal 9.") == [
        "mpirun: rank 3 on w exited on signal 9"
    ]


def test_a_rank_that_exits_non_zero_is_placed_by_the_layout() -> None:
    text = """mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[1456,1],1]
  Exit code:    3
"""
    assert read(text) == ["mpirun: rank 1 on lead-g0-1.pods.ns.svc exited with status 3"]
    assert read(text, ()) == ["mpirun: rank 1 exited with status 3"]


def test_a_rank_that_leaves_early_and_a_lost_daemon() -> None:
    early = """mpirun has exited due to process rank 1 with PID 77 on
node lead-g0-1.pods.ns.svc exiting improperly. There are three reasons this could occur:"""
    assert read(early) == ["mpirun: rank 1 on lead-g0-1.pods.ns.svc exited before the others (improperly)"]
    lost = """ORTE has lost communication with a remote daemon.

  HNP daemon   : [[9,0],0] on node lead-0
  Remote daemon: [[9,0],1] on node lead-g0-1.pods.ns.svc
"""
    assert read(lost) == ["mpirun: lost the connection to the MPI daemon on lead-g0-1.pods.ns.svc"]


def test_other_lines_say_nothing() -> None:
    assert read("Exit code: 3\nPrimary job  terminated normally, but 1 process returned\nI1130 x] ok") == []


def test_each_rank_is_placed_on_its_pod() -> None:
    def config(**env: str) -> PodConfig:
        return PodConfig.from_env({"LLMOP_MODEL_REPO": "/repo", **env})

    group = config(LLMOP_TP="2", LLMOP_PP="2", LLMOP_GPUS_PER_POD="2", LLMOP_PODS_PER_REPLICA="2",
                   LLMOP_GROUP_INDEX="3",
                   LLMOP_WORKER_HOST_PATTERN="d-g{group}-{worker}.h.ns.svc")  # fmt: skip
    assert rank_places(group, "d-3") == ("d-3", "d-3", "d-g3-1.h.ns.svc", "d-g3-1.h.ns.svc")
    assert rank_places(config(LLMOP_TP="2", LLMOP_GPUS_PER_POD="2"), "one-0") == ("one-0", "one-0")


MPIRUN = shutil.which("mpirun")


@pytest.mark.skipif(MPIRUN is None, reason="Open MPI is not installed")
@pytest.mark.parametrize(
    ("ending", "said"),
    [(f"kill -{int(signal.SIGTERM)} $$", "mpirun: rank 1 on {node} exited on signal 15 (Terminated)"),
     ("exit 3", "mpirun: rank 1 on lead-g0-1.pods.ns.svc exited with status 3")],
)  # fmt: skip
def test_real_mpiruns_words(ending: str, said: str) -> None:
    """Rank 1 of a real two-rank world ends on its own: mpirun's output names it."""
    assert MPIRUN is not None
    rank = f'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then sleep 0.5; {ending}; fi; sleep 20'
    run = subprocess.run([MPIRUN, "--allow-run-as-root", "--oversubscribe", "-n", "2", "sh", "-c", rank],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode != 0
    found = read(run.stdout + run.stderr)
    node = next((line.split(" on node ")[1].split()[0] for line in (run.stdout + run.stderr).splitlines()
                 if " on node " in line), "")  # fmt: skip
    assert found == [said.format(node=node)], run.stdout + run.stderr


def test_a_daemon_that_never_started_is_reported_with_what_the_agent_or_the_shell_said() -> None:
    block = "\n--------\nORTE was unable to reliably start one or more daemons.\nThis usually is caused by:\n"
    noise = "llm-operator-frontdoor: serving m on port 8080\n"  # the front door shares the pipe
    reasons = [
        "llm-operator-launch-agent: w:2222: connection refused (no launch agent listening: the worker is "
        "starting or stopping)",
        "llm-operator-launch-agent: w:2222: did not prove it is one of this deployment's workers "
        "(certificate verify failed)",
        "bash: orted: command not found",
        "sh: 1: /opt/hpcx/ompi/bin/orted: not found",
    ]
    for said in reasons:
        found = read(noise + said + "\n" + noise + block)
        assert found == [f"mpirun: could not start its daemon on a worker: {said}"], found
    assert read(block) == ["mpirun: could not start its daemon on a worker"]


@pytest.mark.skipif(MPIRUN is None, reason="Open MPI is not installed")
def test_real_mpirun_forwards_what_the_agent_said_when_a_worker_is_not_reached(tmp_path: Path) -> None:
    """The leader's launch agent cannot reach a worker (a name that does not resolve): the report
    names the agent's reason."""
    assert MPIRUN is not None
    agent = f"{sys.executable} -m llm_operator.runtime.launch_agent"
    leader, _ = role_dirs(tmp_path)
    run = subprocess.run([MPIRUN, "--allow-run-as-root", "--mca", "plm_rsh_agent", agent,
                          "--mca", "orte_keep_fqdn_hostnames", "1", "--mca",
                          "plm_rsh_no_tree_spawn", "1", "--host", "localhost:1,worker.invalid:1", "-n", "2",
                          "sleep", "5"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(OPERATOR),
                              "LLMOP_LAUNCH_IDENTITY_DIR": str(leader)})  # fmt: skip
    assert run.returncode != 0
    (said,) = read(run.stdout + run.stderr)
    assert said.startswith(
        "mpirun: could not start its daemon on a worker: llm-operator-launch-agent: worker.invalid:2222: "
        "does not resolve"
    ), run.stdout + run.stderr
