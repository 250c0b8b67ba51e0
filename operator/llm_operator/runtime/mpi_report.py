"""What mpirun says when a world ends because of one member, read back as one line naming the rank
and its pod: the leader's termination message, and so the deployment's GroupRecreated Event, says
which member failed and how, not only that mpirun exited.

mpirun prints its reports as help texts over several lines (Open MPI v4.1.4, as Debian's openmpi-bin
4.1.4 in the cpu-runtime image and HPC-X's 4.1 in NVIDIA's install them: orte/tools/orterun/
help-orterun.txt [orterun:proc-aborted-strsignal], [orterun:proc-aborted], [orterun:non-zero-exit],
[orterun:proc-exit-no-sync]; orte/mca/errmgr/base/help-errmgr-base.txt [node-died]):

    mpirun noticed that process rank 1 with PID 0 on node w-1 exited on signal 15 (Terminated).
    mpirun detected that one or more processes exited with non-zero status, ... The first process
    to do so was:  /  Process name: [[1456,1],1]  /  Exit code:    3
    mpirun has exited due to process rank 1 with PID 7 on  /  node w-1 exiting improperly. ...
    ORTE has lost communication with a remote daemon.  /  ...  /  Remote daemon: [[9,0],1] on node w-1

and, when a worker's daemon never started (help-errmgr-base.txt [failed-daemon-launch]), after the
line the launch agent (runtime/launch_agent.py) or the worker's shell printed, which mpirun
forwards ("llm-operator-launch-agent: w-1...:2222: connection refused (...)", "sh: 1: orted: not
found"):

    ORTE was unable to reliably start one or more daemons.

The non-zero exit names no node: the rank's pod comes from the launch's layout (`places`, one entry
per rank). Standard library only (the serving images).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from llm_operator.runtime.launch_agent import PROGRAM

_SIGNALED = re.compile(
    r"noticed that process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)(?: \(([^)]*)\))?"
)
_PROCESS = re.compile(r"^\s*Process name:\s*\[\[\d+,\d+\],(\d+)\]")
_EXIT_CODE = re.compile(r"^\s*Exit code:\s*(-?\d+)")
_NO_SYNC = re.compile(r"has exited due to process rank (\d+) with PID \d+ on\s*$")
_NO_SYNC_NODE = re.compile(r"^node (\S+) exiting improperly")
_DAEMON = re.compile(r"^\s*Remote daemon:\s*\S+ on node (\S+)")
_NOT_STARTED = re.compile(r"^ORTE was unable to reliably start one or more daemons")
# Why a worker's daemon never started, as the launch agent or the worker's shell says it: a worker
# not listening or not this deployment's, a name that does not resolve, orted missing.
_NOT_LAUNCHED = re.compile(
    rf"^({PROGRAM}: .*|.*orted.*(command not found|not found|No such file or directory"
    r"|error while loading shared libraries).*)$"
)


class MpiReport:
    """Fed mpirun's output line by line; returns the one-line reading of a report when its last
    line arrives."""

    def __init__(self, places: Sequence[str] = ()) -> None:
        self.places = places  # rank -> the host mpirun placed it on
        self._rank: int | None = None
        self._not_launched = ""  # the last line saying why a daemon did not start

    def _place(self, rank: int) -> str:
        return f" on {self.places[rank]}" if rank < len(self.places) else ""

    def feed(self, line: str) -> str | None:
        if found := _SIGNALED.search(line):
            rank, node, signal, name = found.groups()
            return f"mpirun: rank {rank} on {node} exited on signal {signal}" + (f" ({name})" if name else "")
        if found := _PROCESS.match(line):
            self._rank = int(found.group(1))
            return None
        if (found := _EXIT_CODE.match(line)) and self._rank is not None:
            rank, self._rank = self._rank, None
            return f"mpirun: rank {rank}{self._place(rank)} exited with status {found.group(1)}"
        if found := _NO_SYNC.search(line):
            self._rank = int(found.group(1))
            return None
        if (found := _NO_SYNC_NODE.match(line)) and self._rank is not None:
            rank, self._rank = self._rank, None
            return f"mpirun: rank {rank} on {found.group(1)} exited before the others (improperly)"
        if found := _DAEMON.match(line):
            return f"mpirun: lost the connection to the MPI daemon on {found.group(1)}"
        if _NOT_LAUNCHED.match(line.strip()):
            self._not_launched = line.strip()
            return None
        if _NOT_STARTED.match(line):
            why = f": {self._not_launched}" if self._not_launched else ""
            return f"mpirun: could not start its daemon on a worker{why}"
        return None
