"""A worker hosts one world at a time (runtime/supervisor.py stale_launches): when a leader's new
launch runs while processes of an earlier one still do (their leader gone without ending them: a
lost node), the worker's launcher ends the earlier ones. Pure on process tables, then with real
processes under a real Supervisor: orteds stood in for by processes that leave their parent, as
Open MPI's leave the launch agent's session that started them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from llm_operator.runtime.drain import close_to_launches
from llm_operator.runtime.launch_agent import SESSION_TITLE
from llm_operator.runtime.processes import orphaned_shm, remove_orphaned_shm, stale_launches
from llm_operator.runtime.supervisor import LAUNCHER_PID_FILE

from tests.unit.test_launcher import MULTI, alive, config

AGENT = ["python3", "-m", "llm_operator.runtime.launch_agent", "--serve"]
ORTED, RANK = ["orted", "-mca"], ["python3", "-m", "r"]


def test_every_launch_but_the_newest_is_stale_with_all_under_it() -> None:
    table = {
        1: (0, ["launcher"]), 2: (1, AGENT),
        10: (1, ORTED), 11: (10, RANK),  # an earlier launch's orted, re-parented to the launcher
        20: (1, ORTED), 21: (20, RANK), 22: (20, RANK),  # the newest
        30: (2, [SESSION_TITLE, "-c", "x"]),  # a launch still in its agent's session: left alone
        31: (1, [SESSION_TITLE, "-c", "y"]),  # a session whose agent is gone: no launch either
        60: (1, ["python3", "-c", "helper"]),  # a rank's double-forked helper, the newest: no launch
        40: (1, []),  # a zombie not reaped yet: no launch
    }  # fmt: skip
    started = {10: 500, 20: 900, 31: 999, 40: 999, 60: 999}.__getitem__
    assert sorted(stale_launches(table, 1, 2, started)) == [10, 11]
    assert stale_launches({k: v for k, v in table.items() if k < 20}, 1, 2, started) == []  # one world


# The launch agent's stand-in: two launches whose orteds (sleeps titled orted) leave their sessions, as Open
# MPI's do, one a second after the other; the listener stays.
FAKE_AGENT = """
( exec -a orted sleep 60 & )
sleep 1
( exec -a orted sleep 61 & )
sleep 100
"""
SUPERVISE = """
import sys
from llm_operator.runtime.supervisor import Policy, Stop, Supervisor, become_subreaper
stop = Stop()
stop.install()
become_subreaper()
name = "the launch agent"
sys.exit(Supervisor(["bash", "-c", sys.argv[1]], Policy.FOLLOW_LEADER, 1, stop, name=name).run())
"""


def sleeps(root: int) -> dict[str, int]:
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if argv[0] == "orted" and argv[1] in ("60", "61") and str(root) in _ancestors(int(pid)):
            found[argv[1]] = int(pid)
    return found


def _ancestors(pid: int) -> list[str]:
    chain = []
    while pid > 1:
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
        chain.append(str(pid))
    return chain


def test_a_worker_ends_an_earlier_launch_when_a_new_one_logs_in() -> None:
    proc = subprocess.Popen([sys.executable, "-c", SUPERVISE, FAKE_AGENT], stderr=subprocess.PIPE, text=True)
    try:
        deadline, seen = time.monotonic() + 20, {}
        while "61" not in seen and time.monotonic() < deadline:
            seen.update(sleeps(proc.pid))
            time.sleep(0.05)
        assert set(seen) == {"60", "61"}, seen
        while alive(seen["60"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(seen["60"]) and alive(seen["61"])  # the earlier launch ended, the newest kept
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert "a new launch runs while an earlier one's processes still ran (1; its leader" in err, err


# The launch agent's stand-in holding one launch: its orted (a sleep titled orted) leaves the
# session, as Open MPI's does.
ONE_LAUNCH = """
( exec -a orted sleep 60 & )
sleep 100
"""


def _worker(tmp_path: Path) -> tuple[subprocess.Popen[str], dict[str, int]]:
    proc = subprocess.Popen([sys.executable, "-c", SUPERVISE, ONE_LAUNCH], stderr=subprocess.PIPE, text=True)
    deadline, seen = time.monotonic() + 20, {}
    while "60" not in seen and time.monotonic() < deadline:
        seen.update(sleeps(proc.pid))
        time.sleep(0.05)
    assert "60" in seen
    (tmp_path / LAUNCHER_PID_FILE).write_text(str(proc.pid))  # as the worker's launcher writes it
    return proc, seen


def _closed(proc: subprocess.Popen[str], tmp_path: Path) -> None:
    """The worker's preStop, as the pod runs it: drain.py's first step."""
    close_to_launches(config(**MULTI, LLMOP_ROLE="worker", LLMOP_RUNTIME_DIR=str(tmp_path)))
    deadline = time.monotonic() + 10
    while _listener(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _listener(root: int) -> bool:
    """The stand-in agent (bash, the supervisor's child) still runs."""
    return any(
        Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"bash\0-c")
        for pid in filter(str.isdigit, os.listdir("/proc"))
        if _ppid(int(pid)) == root
    )


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def test_a_stopping_worker_takes_no_new_launch_and_keeps_its_world_until_it_ends(tmp_path: Path) -> None:
    """A worker's preStop stops its launch agent at once (a recreated group's new leader could otherwise
    start ranks on a pod about to go, by its DNS name); the running launch is left to its leader,
    and when it ends the launcher exits 0 without waiting for SIGTERM."""
    proc, seen = _worker(tmp_path)
    try:
        _closed(proc, tmp_path)
        assert not _listener(proc.pid)  # no new launch
        time.sleep(1)  # several of the supervisor's polls: the agent's exit is no cause to stop the world
        assert alive(seen["60"]) and proc.poll() is None
        os.kill(seen["60"], signal.SIGKILL)  # the leader's world ends
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate(timeout=30)
    assert "the pod is stopping: the launch agent takes no new launch (the running world stays)" in err, err
    assert "stopping the rest" not in err, err


def test_sigterm_after_the_door_closed_ends_the_world_and_exits_0(tmp_path: Path) -> None:
    proc, seen = _worker(tmp_path)
    try:
        _closed(proc, tmp_path)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert not alive(seen["60"])
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)


HOLD = """
import mmap, os, sys, time
held = open(sys.argv[1], "rb")  # open: its descriptor holds it
with open(sys.argv[2], "r+b") as f:
    mapped = mmap.mmap(f.fileno(), 4096)  # mapped, its descriptor closed: the mapping holds it
print("ready", flush=True)
time.sleep(60)
"""


def test_a_killed_worlds_files_in_shm_are_found_and_only_they(tmp_path: Path) -> None:
    """/dev/shm outlives a relaunch in place: the world's files no live process holds (open or
    mapped) are orphans; held ones, and names no world writes, are left; and none while a process
    cannot be read (it might hold any). The processes looked at are this one and a holder (a pod's
    launcher sees its container's)."""
    shm, proc = tmp_path / "shm", tmp_path / "proc"
    shm.mkdir()
    proc.mkdir()
    for name in ("rank0_region", "nccl-peer", "vader_segment.orphan", "rank1_orphan", "someone-elses"):
        (shm / name).write_bytes(b"\0" * 4096)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(shm / "rank0_region"), str(shm / "nccl-peer")],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    for pid in (os.getpid(), holder.pid):
        (proc / str(pid)).symlink_to(f"/proc/{pid}")
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        assert sorted(f.name for f in orphaned_shm(shm, proc)) == ["rank1_orphan", "vader_segment.orphan"]
        assert sorted(remove_orphaned_shm(shm, proc)) == ["rank1_orphan", "vader_segment.orphan"]
        assert sorted(f.name for f in shm.iterdir()) == ["nccl-peer", "rank0_region", "someone-elses"]
        (proc / "1" / "maps").mkdir(parents=True)  # a process whose maps cannot be read
        (shm / "rank2_orphan").write_bytes(b"")
        assert orphaned_shm(shm, proc) == []
    finally:
        holder.kill()
        holder.wait()
    (proc / "1" / "maps").rmdir()
    (proc / "1").rmdir()
    assert sorted(f.name for f in orphaned_shm(shm, proc)) == ["nccl-peer", "rank0_region", "rank2_orphan"]
