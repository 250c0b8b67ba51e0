"""Supervision of this pod's servers: the launcher stays the parent of every rank until all are
gone, stops them in order on SIGTERM, and reaps orphans (it may be PID 1).

Upstream's launch_triton_server.py Popen's mpirun and returns, so a crashed rank goes unnoticed;
here any rank that exits takes the pod down with a non-zero status. SIGTERM goes to rank 0 alone
first, so its in-flight requests finish while the rest of the MPI world still answers, then to
everything else (mpirun itself kills the ranks at once: `odls_base_sigkill_timeout 0`, commands.py).

Companions (the OpenAI front door, frontdoor/) run beside the server under the same rules: one that
exits unasked takes the pod down like a lost rank; on a requested stop they keep serving while
Triton drains and get SIGTERM once it is gone, so streams in flight end with their last token.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from enum import StrEnum
from types import FrameType

from llm_operator.contract import KILL_GRACE_SECONDS, LAUNCHER, STALLED_PREFIX
from llm_operator.runtime.mpi_report import MpiReport
from llm_operator.runtime.processes import (
    RankWatch,
    Table,
    descendants,
    process_table,
    remove_orphaned_shm,
    stale_launches,
)

# Exit statuses of a server that stopped without being asked (besides its own, passed through, and
# 128+N for one killed by signal N).
EXIT_SERVER_GONE = 1  # a server exited on its own with status 0, or one rank vanished
EXIT_NOT_FOUND = 127
# How long a world that lost a rank leaves mpirun to finish its own abort and report the rank
# before it is stopped like the rest (the container's restart, which relaunches the group, waits for it):
# on the real node's 2 shared cores 1 s was too short for Open MPI to print its report.
MPI_REPORT_SECONDS = 4.0


# A worker pod's preStop began (drain.py sends it to the launcher named in LAUNCHER_PID_FILE).
CLOSING_SIGNAL = signal.SIGUSR1
LAUNCHER_PID_FILE = "launcher.pid"  # in the pod's runtime directory


class Policy(StrEnum):
    SERVER = "server"  # the child is the serving tritonserver itself
    RANK0_FIRST = "rank0-first"  # mpirun: stop rank 0, then the rest; any rank lost is fatal
    FOLLOW_LEADER = "follow-leader"  # worker: its ranks belong to the leader's mpirun, which stops them


class Stop:
    """SIGTERM/SIGINT, remembered from the launcher's first instruction on; and CLOSING_SIGNAL,
    a worker's preStop beginning (drain.py), which only closes the door to new launches."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.closing = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)
        signal.signal(CLOSING_SIGNAL, self._close)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.signum = signum

    def _close(self, _signum: int, _frame: FrameType | None) -> None:
        self.closing = True


def become_subreaper() -> None:
    """Orphaned ranks (after mpirun dies) are re-parented to us, so we can see, stop and reap
    them even when we are not PID 1."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def log(message: str) -> None:
    print(f"{LAUNCHER}: {message}", file=sys.stderr, flush=True)
    LAST_WORDS[0] = message


# Why the pod stopped, for its termination message: the launcher's line saying why it stopped the
# servers unasked (CAUSE) and its last line, the server's last error lines (glog's E-lines, as
# Triton and TensorRT-LLM write them, and Triton's final `error: ...`), most recent last, then what
# names the member that broke the world: mpirun's report of a lost rank (mpi_report.py) or the
# front door's stall line (frontdoor/stall.py). The operator keeps a long message's end.
CAUSE = [""]
LAST_WORDS = [""]
SERVER_ERRORS: deque[str] = deque(maxlen=3)
WHY: deque[str] = deque(maxlen=2)
_STALLED = re.compile(rf"^[\w.-]+: ({re.escape(STALLED_PREFIX)}.*)$")
_GLOG_ERROR = re.compile(r'^E\d{4} [\d:.]+\s+\d+ [^\]]+\] "?(?P<text>.*?)"?$')
MAX_TERMINATION_MESSAGE = 2048  # the kubelet reads 4096 bytes at most


def error_line(line: str) -> str | None:
    """The text of a server's error line, or None for any other line."""
    found = _GLOG_ERROR.match(line)
    if found:
        return found.group("text")
    return line if line.startswith("error: ") else None


def relay(fd: int, report: MpiReport) -> None:
    """Copy the server's output to our stderr line by line (whole lines: one write each), keeping
    its error lines and the lines that say why the world ended; returns at EOF, once every process
    holding the pipe is gone."""
    with open(fd, "rb") as pipe:
        for line in pipe:
            os.write(sys.stderr.fileno(), line)
            text = line.decode(errors="replace").rstrip()
            error = error_line(text)
            if error:
                SERVER_ERRORS.append(error)
            why = report.feed(text) or ((m := _STALLED.match(text)) and m.group(1))
            if why:
                WHY.append(why)


def termination_message() -> str:
    lines = dict.fromkeys(line for line in (CAUSE[0], LAST_WORDS[0], *SERVER_ERRORS, *WHY) if line)
    return "\n".join(lines)[-MAX_TERMINATION_MESSAGE:]


@dataclass
class Supervisor:
    """Runs argv as our only child (in its own session) and stays until it and everything it
    started are gone. Exit status: 0 after a requested stop that finished in time, 137 when it
    had to SIGKILL, else the server's own status, EXIT_SERVER_GONE for a clean exit nobody asked
    for or a vanished rank, 128+N when killed by signal N."""

    argv: list[str]
    policy: Policy
    exit_timeout: float
    stop: Stop
    ranks: tuple[str, ...] = ()  # --id of the ranks this pod hosts (rank0 first)
    companions: tuple[tuple[str, ...], ...] = ()  # argv of processes served beside the server
    wrappers: tuple[str, ...] = ()  # programs that start a rank without being it (rank_pids)
    name: str = "the server"  # what argv is, in the log: a worker's is the launch agent
    places: tuple[str, ...] = ()  # the host of each rank of the world, for mpirun's reports
    poll: float = 0.2

    def run(self) -> int:
        me = os.getpid()
        read_fd, write_fd = os.pipe()
        out = [(os.POSIX_SPAWN_DUP2, write_fd, 1), (os.POSIX_SPAWN_DUP2, write_fd, 2)]
        spawned: list[int] = []
        try:
            for argv in (self.argv, *self.companions):
                spawned.append(os.posix_spawnp(argv[0], list(argv), dict(os.environ), setsid=True,
                                               file_actions=out))  # fmt: skip
        except OSError as e:
            log(f"cannot start {argv[0]}: {e}")
            for pid in spawned:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            os.close(read_fd)
            return EXIT_NOT_FOUND
        finally:
            os.close(write_fd)
        child, companions = spawned[0], set(spawned[1:])
        relaying = threading.Thread(target=relay, args=(read_fd, MpiReport(self.places)), daemon=True)
        relaying.start()
        status: int | None = None
        companion_status: int | None = None
        ranks = RankWatch(self.ranks, self.wrappers)
        cause, phase, deadline, killed, spared = "", "", 0.0, False, 0.0
        closed = False  # a worker's launch agent was stopped at its preStop: no new launch, the world stays
        sweep, killed_pids = False, list[int]()  # a worker's stale launches ended, /dev/shm to sweep

        def signal_all(table: Table, sig: int, spare: int = 0) -> None:
            for pid in descendants(table, me):
                with contextlib.suppress(ProcessLookupError):
                    if pid != spare:
                        os.kill(pid, sig)

        while True:
            reaped = self._reap({child, *companions})
            status = reaped.pop(child, status)
            for pid, st in reaped.items():
                companions.discard(pid)
                if not phase and companion_status is None:
                    companion_status = st
            table = process_table()
            if status is not None and not descendants(table, me):
                break
            following = self.policy == Policy.FOLLOW_LEADER and not phase
            stale = stale_launches(table, me, child) if following else []
            if stale:
                log(f"a new launch runs while an earlier one's processes still ran ({len(stale)}; its "
                    "leader is gone): ending them")  # fmt: skip
                for pid in stale:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                sweep = True
            elif sweep and not set(killed_pids) & set(table):
                sweep = False  # what the ended world left in /dev/shm, once its processes are gone
                if removed := remove_orphaned_shm():
                    log(f"removed {len(removed)} file(s) the ended world left in /dev/shm")
            killed_pids = stale or killed_pids
            live, vanished = ranks.update(table, me)
            gone = vanished if self.policy == Policy.RANK0_FIRST else []
            now = time.monotonic()
            if not phase and ((status is not None and not closed) or gone or companion_status is not None):
                # Nobody asked: the server, a rank or a companion went away. Stop whatever is left.
                if status is not None:
                    cause = "exited"
                    log(f"{self.name} exited ({_describe(status)}): stopping the rest")
                elif gone:
                    cause = "lost"
                    log(f"{gone[0]} exited: stopping the others")
                else:
                    assert companion_status is not None
                    cause = "companion"
                    log(
                        f"{' '.join(self.companions[0])} exited ({_describe(companion_status)}): "
                        f"stopping {self.name}"
                    )
                CAUSE[0] = LAST_WORDS[0]
                # A lost rank: mpirun, aborting the world already, ends the other pods' ranks and
                # says which rank failed where (its report ends the termination message); SIGTERM
                # would cut it short. The kill deadline below still covers it.
                lost = cause == "lost" and self.policy == Policy.RANK0_FIRST
                signal_all(table, signal.SIGTERM, spare=child if lost else 0)
                phase, deadline = "terminating", now + KILL_GRACE_SECONDS
                spared = now + MPI_REPORT_SECONDS if lost else 0.0
            elif spared and now > spared and status is None:
                with contextlib.suppress(ProcessLookupError):  # mpirun had its time to report
                    os.kill(child, signal.SIGTERM)
                spared = 0.0
            elif self.policy == Policy.FOLLOW_LEADER and not phase and not closed and self.stop.closing:
                # The pod is being deleted, and its preStop waits on the leader: a new leader (its
                # group recreated) could meanwhile reach this pod's launch agent by its DNS name and start
                # ranks on a pod about to go. A refused connection makes it wait for the new pod.
                log(f"the pod is stopping: {self.name} takes no new launch (the running world stays)")
                os.kill(child, signal.SIGTERM)
                closed = True
            elif not phase and self.stop.signum is not None:
                log(f"signal {self.stop.signum}: stopping ({self.policy.value})")
                cause, phase, deadline = "stop", "draining", now + self.exit_timeout + KILL_GRACE_SECONDS
                if self.policy == Policy.SERVER:
                    os.kill(child, signal.SIGTERM)  # Triton waits up to its exit timeout for requests
                    phase = "terminating"
                elif self.policy == Policy.RANK0_FIRST and self.ranks[0] in live:
                    os.kill(live[self.ranks[0]], signal.SIGTERM)  # drains with the other ranks up
                elif self.policy == Policy.RANK0_FIRST:
                    signal_all(table, signal.SIGTERM)  # rank 0 is not running: nothing to drain
                    phase, deadline = "terminating", now + KILL_GRACE_SECONDS
                elif not closed:  # a worker on its way out takes no new launch (a new leader's,
                    os.kill(child, signal.SIGTERM)  # while its pod is still a DNS name); the world stays
            elif phase == "draining":
                if self.policy == Policy.RANK0_FIRST:
                    drained = self.ranks[0] not in live
                else:  # a worker without Triton ranks (pytorch) waits for every process of the leader's
                    drained = (
                        not live if self.ranks else not [p for p in descendants(table, me) if p != child]
                    )
                if drained or now > deadline:
                    signal_all(table, signal.SIGTERM)
                    phase, deadline = "terminating", now + KILL_GRACE_SECONDS
            elif phase and status is not None and companions:
                for pid in companions:  # the server is gone: nothing is left for them to serve
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGTERM)
                companions.clear()
            elif phase == "terminating" and now > deadline:
                log("still running after the exit timeout: SIGKILL")
                signal_all(table, signal.SIGKILL)
                phase, killed = "killed", True
            time.sleep(self.poll)
        relaying.join(timeout=2)
        if cause == "stop" or (closed and not cause):  # closed: its world ended before SIGTERM came
            return 128 + signal.SIGKILL if killed else 0
        if not cause:  # gone, with nothing left to stop, before the loop saw it
            log(f"{self.name} exited ({_describe(status)})")
        final = companion_status if cause == "companion" else status
        assert final is not None  # the loop ends once the server is reaped
        code = _exit_code(final)
        return code if cause != "lost" and code else EXIT_SERVER_GONE

    def _reap(self, watched: set[int]) -> dict[int, int]:
        """Reap every exited child (orphans included); the wait statuses of those in `watched`."""
        found: dict[int, int] = {}
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return found
            if pid == 0:
                return found
            if pid in watched:
                found[pid] = st


def _describe(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    return f"killed by signal {-code}" if code < 0 else f"status {code}"


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code
