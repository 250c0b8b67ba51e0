"""This pod's processes as the launcher sees them in /proc: the tree under it, its ranks (found by
their `--id`, kept by their process), and a worker's launches. Standard library only (the serving
images)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

Table = Mapping[int, tuple[int, list[str]]]  # pid -> (parent pid, argv)


def process_table(proc: Path = Path("/proc")) -> dict[int, tuple[int, list[str]]]:
    """pid -> (parent pid, argv) of every live process; zombies are left out. A live process may
    show no argv for an instant: while it execs, /proc/PID/cmdline reads empty until the kernel
    has mapped the new program's arguments."""
    table: dict[int, tuple[int, list[str]]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
        except (OSError, IndexError, ValueError):
            continue  # exited while we looked
        if state not in ("Z", "X"):
            table[int(entry.name)] = (int(ppid), argv)
    return table


def descendants(table: Table, root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def rank_pids(table: Table, root: int, ranks: Iterable[str], wrappers: Iterable[str] = ()) -> dict[str, int]:
    """Live rank processes under root, by --id. mpirun puts each rank in its own process group,
    so ranks are found in the process tree, not by signalling a group. A process whose command
    line names one of `wrappers` (and mpirun's, which names it too) only starts a rank, and one
    whose parent is the same rank is the rank's fork on its way to another program (Triton's
    Python backend starting a stub)."""
    wanted = {f"--id={r}": r for r in ranks}
    skip = set(wrappers)

    def rank_of(pid: int) -> str | None:
        argv = table[pid][1] if pid in table else []
        ids = [arg for arg in argv if arg.startswith("--id=")]
        # mpirun's own command line names every rank
        return wanted.get(ids[0]) if len(ids) == 1 and not skip.intersection(argv) else None

    found: dict[str, int] = {}
    for pid in descendants(table, root):
        rank = rank_of(pid)
        if rank is not None and rank_of(table[pid][0]) != rank:
            found[rank] = pid
    return found


@dataclass
class RankWatch:
    """The ranks of this pod, each the process first found as it (rank_pids) until that process
    is gone. A rank's command line alone would lose it for an instant at each exec (the launch
    wrapper becoming the server reads as no argv: process_table), and a rank taken for lost
    stops the world: on the real node's busy cores a new group's leader stopped its own starting
    rank 0 so (tests/e2e/test_cpu_multi_node.py, scaled up and canaried)."""

    ranks: tuple[str, ...]
    wrappers: tuple[str, ...] = ()
    seen: dict[str, int] = field(default_factory=dict)

    def update(self, table: Table, root: int) -> tuple[dict[str, int], list[str]]:
        """The ranks running (rank -> pid), and those seen before that are gone."""
        if not self.ranks:  # a worker of the PyTorch shape hosts none: no walk of its tree each poll
            return {}, []
        for rank, pid in rank_pids(table, root, self.ranks, self.wrappers).items():
            self.seen.setdefault(rank, pid)
        live = {rank: pid for rank, pid in self.seen.items() if pid in table}
        return live, [rank for rank in self.seen if rank not in live]


def start_time(pid: int, proc: Path = Path("/proc")) -> int:
    """When the process started, in clock ticks since boot (/proc/PID/stat field 22); 0 if gone."""
    try:
        return int((proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


def _orted(argv: list[str]) -> bool:
    """Open MPI's daemon as a leader's launch starts it on a worker (`<prefix>/bin/orted -mca ...`)."""
    return bool(argv) and os.path.basename(argv[0]) == "orted"


def stale_launches(
    table: Table, root: int, server: int, started: Callable[[int], int] = start_time
) -> list[int]:
    """A worker's processes of an earlier launch, to end when a newer one runs: Open MPI's orted
    leaves the launch agent's session that started it (it daemonizes, and the session ends at once)
    and lives on under the worker's launcher, the child subreaper `root`, one
    orted per launch; every one but the newest, with everything under it, is stale. A leader
    launches once per world, so an older one still running means its leader is gone without ending
    it (a lost node, a partition: orted may wait on a dead TCP peer for hours, its ranks holding the
    GPUs the new world's ranks need). Only orteds count: a session's shell left under the launcher
    (its agent gone) or a process a rank double-forked is no launch, and taking it for the newest
    would end the running world's orted."""
    launches = [pid for pid, (ppid, argv) in table.items()
                if ppid == root and pid != server and _orted(argv)]  # fmt: skip
    if len(launches) < 2:
        return []
    newest = max(launches, key=lambda pid: (started(pid), pid))
    return [p for pid in launches if pid != newest for p in (pid, *descendants(table, pid))]


SHM = Path("/dev/shm")  # the pod's memory-backed emptyDir (render/pod.py): it outlives a container
# What a world writes there: Triton's python-backend regions (their prefix is the rank's --id,
# commands.py rank_args), NCCL's shared-memory transport, Open MPI's vader segments.
WORLD_SHM_PREFIXES = ("rank", "nccl-", "vader_segment")


def orphaned_shm(shm: Path = SHM, proc: Path = Path("/proc"),
                 prefixes: tuple[str, ...] = WORLD_SHM_PREFIXES) -> list[Path]:  # fmt: skip
    """A world's files in `shm` that no live process holds open or mapped: what a killed world left.
    The volume outlives the container and is charged to the pod's memory, so a group relaunched
    again and again in its pods would fill it (pods recreated for each relaunch used to start
    empty). None when a process cannot be read: nothing is taken for an orphan that might not be."""
    held: set[str] = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            maps = (entry / "maps").read_text()
            fds = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
        except FileNotFoundError:
            continue  # exited while we looked
        except OSError:
            return []
        held.update(fds)
        held.update(line.split(None, 5)[5].removesuffix(" (deleted)") for line in maps.splitlines()
                    if line.count(" ") >= 5 and str(shm) in line)  # fmt: skip
    try:
        files = [f for f in shm.iterdir() if f.name.startswith(prefixes) and f.is_file()]
    except OSError:
        return []
    return [f for f in files if str(f) not in held]


def remove_orphaned_shm(shm: Path = SHM, proc: Path = Path("/proc")) -> list[str]:
    """Remove what orphaned_shm finds; the names removed."""
    removed = []
    for f in orphaned_shm(shm, proc):
        try:
            f.unlink()
        except OSError:
            continue
        removed.append(f.name)
    return removed
