"""Local processes: free ports, detached children, finding the processes of one state dir in /proc
(never by name alone), stopping them, RSS. Nothing here knows which components exist."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

STOP_TIMEOUT_S = 15.0


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports free on 127.0.0.1 right now."""
    # Held open together so the kernel hands out distinct ports; a port taken by someone else
    # before its user binds it surfaces there as "address already in use".
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    """One TCP port free on 127.0.0.1 right now."""
    return free_ports(1)[0]


def proc_args(pid: int) -> list[str]:
    """The command line of `pid`, [] if it is gone or unreadable."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def running(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def last_line(path: Path) -> str:
    """The last non-empty line of a log, shortened: the usual place a Go program says why it quit."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def owned_by(pid: int, binaries: Collection[str], state_dir: Path) -> str | None:
    """Which of `binaries` live process `pid` runs with a path under `state_dir` in its arguments.

    Checked instead of trusting pid files alone, so a reused pid is never signalled. None for
    anything else, this process included.
    """
    if pid == os.getpid() or not running(pid):
        return None
    args = proc_args(pid)
    needle = f"{state_dir}/"
    if not any(needle in a for a in args):
        return None
    if args and Path(args[0]).name == "nsenter" and "--" in args:
        args = args[args.index("--") + 1 :]  # caught between fork and nsenter's exec
    # A Python helper (the forwarder) runs as `python .../forwarder.py`: matched by its stem.
    names = [Path(a).name for a in args[:2]] + [Path(a).stem for a in args[1:2] if a.endswith(".py")]
    return next((n for n in names if n in binaries), None)


def find_owned(binaries: Collection[str], state_dir: Path) -> dict[int, str]:
    """Every process `owned_by` the state dir, pid files or not: pid -> binary."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (name := owned_by(int(entry.name), binaries, state_dir)):
            found[int(entry.name)] = name
    return found


def _signal(pids: Sequence[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            # Each child leads its own session (see Children.spawn): signal its whole group.
            if os.getpgid(pid) == pid:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)


@dataclass(frozen=True)
class Exited:
    name: str
    code: int
    log: Path


class Children:
    """The processes this launcher spawned, by name. Polling them reaps them, so a stopped child
    does not linger as a zombie while we wait for it to go."""

    def __init__(self) -> None:
        self._procs: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}

    def spawn(
        self, name: str, argv: Sequence[str], log: Path, cwd: Path, env: Mapping[str, str] | None = None
    ) -> int:
        """Start `argv` detached, output to `log`; returns its pid."""
        with log.open("wb") as out:
            # New session: survives the launching shell (and its Ctrl-C); logs go to a file.
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
                cwd=cwd,
            )
        self._procs[name] = (proc, log)
        return proc.pid

    def exited(self) -> Exited | None:
        """The first child that has exited, if any."""
        for name, (proc, log) in self._procs.items():
            code = proc.poll()
            if code is not None:
                return Exited(name, code, log)
        return None

    def _alive(self, pid: int) -> bool:
        for proc, _ in self._procs.values():
            if proc.pid == pid:
                return proc.poll() is None
        return running(pid)

    def terminate(self, pids: Sequence[int], timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM, SIGKILL what is left after `timeout` s; returns once every one is gone."""
        _signal(pids, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(self._alive(p) for p in pids):
            time.sleep(0.05)
        _signal([p for p in pids if self._alive(p)], signal.SIGKILL)
        while any(self._alive(p) for p in pids):
            time.sleep(0.05)

    def pids(self) -> dict[int, str]:
        """The live children: pid -> name."""
        return {proc.pid: name for name, (proc, _) in self._procs.items() if proc.poll() is None}

    def forget(self) -> None:
        self._procs.clear()


T = TypeVar("T")


def in_background(work: Callable[[], T], name: str) -> Callable[[], T]:
    """Start `work` in a daemon thread (a failed `up` does not wait for it); the returned call
    waits for its result or raises its exception."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as e:  # handed to the caller of the result
            failure.append(e)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()

    def result() -> T:
        thread.join()
        if failure:
            raise failure[0]
        return outcome[0]

    return result
