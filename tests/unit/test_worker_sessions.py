"""A worker hosts one world at a time (runtime/supervisor.py stale_sessions): when a leader's new
launch logs in to the worker's sshd while processes of an earlier one still run (their leader gone
without ending them: a lost node), the worker's launcher ends the earlier ones. Pure on process
tables, then with real processes under a real Supervisor, sshd's processes stood in for by
processes named as sshd names them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from llm_operator.runtime.supervisor import stale_sessions

from tests.unit.test_launcher import alive

SSHD, CONN, SH, ORTED, RANK = ["/usr/sbin/sshd", "-D"], ["sshd: u@notty"], ["sh", "-c", "x"], ["orted"], ["r"]


def test_every_session_but_the_newest_is_stale_with_all_under_it() -> None:
    table = {
        1: (0, ["launcher"]), 2: (1, SSHD),
        10: (2, CONN), 11: (10, SH), 12: (11, ORTED), 13: (12, RANK),  # an earlier launch
        20: (2, CONN), 21: (20, SH), 22: (21, ORTED), 23: (22, RANK),  # the newest
        30: (2, ["sshd: [net]"]),  # a connection that never logged in (the leader's port check)
    }  # fmt: skip
    started = {11: 500, 21: 900}.__getitem__
    assert sorted(stale_sessions(table, 1, started)) == [11, 12, 13]
    assert stale_sessions({k: v for k, v in table.items() if k < 20}, 1, started) == []  # one world: none
    # sshd itself gone: its sessions, re-parented to the launcher (subreaper), are still told apart.
    orphaned = {k: ((1, v[1]) if v[0] == 2 else v) for k, v in table.items() if k != 2}
    assert sorted(stale_sessions(orphaned, 1, started)) == [11, 12, 13]


# sshd's listener, connections and sessions as bash names them with `exec -a`: each connection an
# "sshd: u@notty" whose session (a sleep) is its child.
FAKE_SSHD = """
( exec -a "sshd: u@notty" bash -c 'sleep 60; :' ) &
sleep 1
( exec -a "sshd: u@notty" bash -c 'sleep 61; :' ) &
wait
"""
SUPERVISE = """
import sys
from llm_operator.runtime.supervisor import Policy, Stop, Supervisor, become_subreaper
stop = Stop()
stop.install()
become_subreaper()
sys.exit(Supervisor(["bash", "-c", sys.argv[1]], Policy.FOLLOW_LEADER, 1, stop, name="sshd").run())
"""


def sleeps(root: int) -> dict[str, int]:
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if argv[0] == "sleep" and argv[1] in ("60", "61") and str(root) in _ancestors(int(pid)):
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
    proc = subprocess.Popen([sys.executable, "-c", SUPERVISE, FAKE_SSHD], stderr=subprocess.PIPE, text=True)
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
    assert "a new launch logged in while an earlier one's processes still ran (1; its leader" in err, err
