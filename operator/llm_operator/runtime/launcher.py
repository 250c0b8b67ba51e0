"""`llm-operator-launch`: the process Kubernetes watches in every serving pod.

It materializes the model repository from the ConfigMap, starts this pod's Triton ranks and stays
their parent until every one of them is gone. Upstream's launch_triton_server.py Popen's mpirun and
returns, so a crashed rank goes unnoticed; here any rank that exits takes the pod down with a
non-zero status. SIGTERM goes to rank 0 alone first, so its in-flight requests finish while the
rest of the MPI world still answers, then to everything else (mpirun itself would SIGKILL the
ranks a second after SIGTERM). Orphans are reaped: this may be PID 1. `llm-operator-launch drain`
is the preStop hook.

The environment contract (ENV below), the rank layout and the multi-node design are documented in
docs/launcher-and-engines.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from llm_operator.modelrepo import materialize

if TYPE_CHECKING:
    from llm_operator.api.v1alpha1 import LLMDeploymentSpec
    from llm_operator.plan.types import PoolPlan

LAUNCHER = "llm-operator-launch"
BACKENDS = ("tensorrt-engine", "cpu-reference")
TRTLLM_PYTHON_MODELS = ("preprocessing", "postprocessing")
SSH_KEY = "id_ed25519"  # keys of the Secret mounted at LLMOP_SSH_DIR: SSH_KEY and SSH_KEY.pub

# Every variable the launcher reads, with its default ("" = unset). The StatefulSet builder sets
# them; docs/launcher-and-engines.md says what each means.
ENV: dict[str, str] = {
    "LLMOP_BACKEND": "tensorrt-engine",
    "LLMOP_TP": "1",
    "LLMOP_PP": "1",
    "LLMOP_GPUS_PER_POD": "1",
    "LLMOP_PODS_PER_REPLICA": "1",
    "LLMOP_MODEL_REPO_SRC": "/etc/llm-operator/model-repo",
    "LLMOP_MODEL_REPO": "/var/run/llm-operator/model-repo",
    "LLMOP_ENGINE_DIR": "",
    "LLMOP_HTTP_PORT": "8000",
    "LLMOP_GRPC_PORT": "8001",
    "LLMOP_METRICS_PORT": "8002",
    "LLMOP_EXIT_TIMEOUT_SECONDS": "30",
    "LLMOP_DRAIN_TIMEOUT_SECONDS": "20",
    "LLMOP_DRAIN_SETTLE_SECONDS": "5",
    "LLMOP_ROLE": "leader",
    "LLMOP_GROUP_INDEX": "0",
    "LLMOP_WORKER_HOST_PATTERN": "",
    "LLMOP_WORKER_WAIT_SECONDS": "600",
    "LLMOP_LEADER_HOST": "",
    "LLMOP_SSH_DIR": "/etc/llm-operator/ssh",
    "LLMOP_SSH_PORT": "2222",
    "LLMOP_RUNTIME_DIR": "/tmp/llm-operator",
    "LLMOP_TRITONSERVER": "tritonserver",
    "LLMOP_MPIRUN": "mpirun",
    "LLMOP_SSHD": "/usr/sbin/sshd",
    "LLMOP_BACKEND_DIR": "",
    "LLMOP_TRTLLM_MODELS_DIR": "/app/all_models/inflight_batcher_llm",
}

# Exit statuses (besides a server's own, passed through, and 128+N for a server killed by signal N).
EXIT_SERVER_GONE = 1  # a server exited on its own with status 0, or one rank vanished
EXIT_USAGE = 64
EXIT_WORKERS_UNREACHABLE = 69  # multi-node leader: workers' sshd never answered
EXIT_CONFIG = 78  # the environment or the engine directory is wrong: restarting will not help
EXIT_NOT_FOUND = 127
KILL_GRACE_SECONDS = 5.0  # after the last SIGTERM, before SIGKILL


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class PodConfig:
    backend: str
    tp: int
    pp: int
    gpus_per_pod: int
    pods_per_replica: int
    model_repo_src: str
    model_repo: str
    engine_dir: str
    http_port: int
    grpc_port: int
    metrics_port: int
    exit_timeout: int
    drain_timeout: float
    drain_settle: float
    role: str  # leader | worker
    group: int
    worker_host_pattern: str  # leader of a multi-node group; {group} and {worker} placeholders
    worker_wait: float
    leader_host: str  # workers: where the leader's metrics are, for drain
    ssh_dir: str
    ssh_port: int
    runtime_dir: str
    tritonserver: str
    mpirun: str
    sshd: str
    backend_dir: str
    trtllm_models_dir: str

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> PodConfig:
        def get(name: str) -> str:
            return environ.get(name) or ENV[name]

        def num(name: str) -> int:
            try:
                return int(get(name))
            except ValueError:
                raise ConfigError(f"{name}={environ.get(name)!r} is not an integer") from None

        c = cls(
            backend=get("LLMOP_BACKEND"),
            tp=num("LLMOP_TP"),
            pp=num("LLMOP_PP"),
            gpus_per_pod=num("LLMOP_GPUS_PER_POD"),
            pods_per_replica=num("LLMOP_PODS_PER_REPLICA"),
            model_repo_src=get("LLMOP_MODEL_REPO_SRC"),
            model_repo=get("LLMOP_MODEL_REPO"),
            engine_dir=get("LLMOP_ENGINE_DIR"),
            http_port=num("LLMOP_HTTP_PORT"),
            grpc_port=num("LLMOP_GRPC_PORT"),
            metrics_port=num("LLMOP_METRICS_PORT"),
            exit_timeout=num("LLMOP_EXIT_TIMEOUT_SECONDS"),
            drain_timeout=num("LLMOP_DRAIN_TIMEOUT_SECONDS"),
            drain_settle=num("LLMOP_DRAIN_SETTLE_SECONDS"),
            role=get("LLMOP_ROLE"),
            group=num("LLMOP_GROUP_INDEX"),
            worker_host_pattern=get("LLMOP_WORKER_HOST_PATTERN"),
            worker_wait=num("LLMOP_WORKER_WAIT_SECONDS"),
            # LeaderWorkerSet injects LWS_LEADER_ADDRESS into every pod of a group.
            leader_host=get("LLMOP_LEADER_HOST") or environ.get("LWS_LEADER_ADDRESS", ""),
            ssh_dir=get("LLMOP_SSH_DIR"),
            ssh_port=num("LLMOP_SSH_PORT"),
            runtime_dir=get("LLMOP_RUNTIME_DIR"),
            tritonserver=get("LLMOP_TRITONSERVER"),
            mpirun=get("LLMOP_MPIRUN"),
            sshd=get("LLMOP_SSHD"),
            backend_dir=get("LLMOP_BACKEND_DIR"),
            trtllm_models_dir=get("LLMOP_TRTLLM_MODELS_DIR"),
        )
        c.validate()
        return c

    def validate(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"LLMOP_BACKEND={self.backend!r}: expected one of {', '.join(BACKENDS)}")
        if min(self.tp, self.pp, self.gpus_per_pod, self.pods_per_replica) < 1:
            raise ConfigError(
                "LLMOP_TP, LLMOP_PP, LLMOP_GPUS_PER_POD and LLMOP_PODS_PER_REPLICA must be >= 1"
            )
        if self.role not in ("leader", "worker"):
            raise ConfigError(f"LLMOP_ROLE={self.role!r}: expected leader or worker")
        if self.backend == "cpu-reference":
            if self.world_size != 1 or self.multi_node:
                raise ConfigError("the cpu-reference backend runs one process: tp = pp = 1, one pod")
        elif self.multi_node:
            # Pod k of a group hosts ranks k*gpus_per_pod .. (k+1)*gpus_per_pod-1.
            if self.world_size != self.gpus_per_pod * self.pods_per_replica:
                raise ConfigError(
                    f"tp*pp = {self.world_size} must equal LLMOP_GPUS_PER_POD * LLMOP_PODS_PER_REPLICA "
                    f"= {self.gpus_per_pod * self.pods_per_replica}: one rank per GPU in every pod"
                )
            if self.role == "leader" and "{worker}" not in self.worker_host_pattern:
                raise ConfigError(
                    "a multi-node leader needs LLMOP_WORKER_HOST_PATTERN with a {worker} placeholder"
                )
        else:
            if self.world_size > self.gpus_per_pod:
                raise ConfigError(f"tp*pp = {self.world_size} ranks need {self.world_size} GPUs in this pod, "
                                  f"LLMOP_GPUS_PER_POD is {self.gpus_per_pod}")  # fmt: skip
            if self.role == "worker":
                raise ConfigError("LLMOP_ROLE=worker needs LLMOP_PODS_PER_REPLICA > 1")

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    @property
    def multi_node(self) -> bool:
        return self.pods_per_replica > 1

    @property
    def local_ranks(self) -> range:
        """Ranks this pod runs. Workers need not know their position: the leader's mpirun places
        ranks k*gpus_per_pod .. (k+1)*gpus_per_pod-1 on worker k by host order, so a worker
        watches for any rank of the world."""
        if not self.multi_node:
            return range(self.world_size)
        return range(self.gpus_per_pod) if self.role == "leader" else range(self.world_size)


# ---------------------------------------------------------------------------------------------
# Command construction (pure)


def rank_id(rank: int) -> str:
    """tritonserver --id of a rank: how the supervisor finds each rank among its descendants."""
    return f"rank{rank}"


def rank_args(c: PodConfig, rank: int) -> list[str]:
    """tritonserver for one rank. Leader mode: rank 0 serves HTTP, gRPC and metrics; the others
    only load tensorrt_llm and join rank 0's MPI world."""
    args = [
        c.tritonserver,
        f"--id={rank_id(rank)}",
        f"--model-repository={c.model_repo}",
        "--disable-auto-complete-config",
        f"--exit-timeout-secs={c.exit_timeout}",
        # Python-backend stubs of co-located ranks must not share shared-memory regions.
        f"--backend-config=python,shm-region-prefix-name={rank_id(rank)}_",
    ]
    if c.backend_dir:
        args.append(f"--backend-directory={c.backend_dir}")
    if rank == 0:
        return [*args, f"--http-port={c.http_port}", f"--grpc-port={c.grpc_port}",
                f"--metrics-port={c.metrics_port}", "--allow-metrics=true", "--metrics-interval-ms=1000",
                f"--allow-gpu-metrics={str(c.backend != 'cpu-reference').lower()}"]  # fmt: skip
    return [*args, "--allow-http=false", "--allow-grpc=false", "--allow-metrics=false",
            "--model-control-mode=explicit", "--load-model=tensorrt_llm"]  # fmt: skip


def worker_hosts(c: PodConfig) -> list[str]:
    return [c.worker_host_pattern.format(group=c.group, worker=w) for w in range(1, c.pods_per_replica)]


def rsh_args(c: PodConfig, key: str) -> str:
    """How the leader's mpirun reaches the workers' sshd. Pods are recreated with new host keys,
    so host keys are not pinned: the Secret's client key is what authenticates the group."""
    return (f"-p {c.ssh_port} -i {key} -o BatchMode=yes -o StrictHostKeyChecking=no "
            "-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR")  # fmt: skip


def serve_command(c: PodConfig, *, ssh_key: str = "") -> list[str]:
    """What a leader (or single) pod runs: one tritonserver for a world of one, else ONE mpirun
    launching every rank MPMD-style, so all of them form a single MPI world of tp*pp."""
    if c.world_size == 1:
        return rank_args(c, 0)
    mpirun = [c.mpirun, "--allow-run-as-root", "--bind-to", "none", "--map-by", "slot"]
    # Slots fill in host order: localhost takes ranks 0..g-1, worker k ranks k*g..(k+1)*g-1.
    hosts = [f"localhost:{c.gpus_per_pod if c.multi_node else c.world_size}"]
    if c.multi_node:
        hosts += [f"{h}:{c.gpus_per_pod}" for h in worker_hosts(c)]
        mpirun += [
            # orted is not on sshd's default PATH; Open MPI prepends PREFIX/bin and PREFIX/lib.
            "--prefix", str(Path(c.mpirun).parent.parent),
            "--mca", "plm_rsh_args", rsh_args(c, ssh_key),
            # Only the leader holds the client key: no orted-to-orted tree spawn.
            "--mca", "plm_rsh_no_tree_spawn", "1",
            # Pod names resolve only as FQDNs through the headless Service.
            "--mca", "orte_keep_fqdn_hostnames", "1",
        ]  # fmt: skip
    command = [*mpirun, "--host", ",".join(hosts)]
    for rank in range(c.world_size):
        command += [*([":"] if rank else []), "-n", "1", *rank_args(c, rank)]
    return command


# Variables sshd (or a shell) sets for each session itself.
_SESSION_ENV = {"HOME", "PWD", "OLDPWD", "SHLVL", "_", "USER", "LOGNAME", "SHELL", "TERM", "MAIL"}


def sshd_config(c: PodConfig, *, host_key: str, authorized_keys: str, environ: Mapping[str, str]) -> str:
    """sshd for a worker pod. It runs as the container's user (non-root sshd skips privilege
    separation, which needs capabilities the pod drops), and hands ranks the worker's own
    container environment (CUDA, NCCL, library paths) instead of sshd's minimal one."""
    lines = [
        f"Port {c.ssh_port}",
        f"HostKey {host_key}",
        f"AuthorizedKeysFile {authorized_keys}",
        f"PidFile {c.runtime_dir}/sshd.pid",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        "UsePAM no",
        "StrictModes no",  # Secret and emptyDir modes are not OpenSSH's
        "AllowTcpForwarding no",
        "X11Forwarding no",
        "PrintMotd no",
    ]
    env = [
        f'{k}="{v}"'
        for k, v in sorted(environ.items())
        if k not in _SESSION_ENV
        and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)
        and not re.search(r'["\\\n]', v)
    ]
    if env:
        lines.append("SetEnv " + " ".join(env))
    return "\n".join(lines) + "\n"


def worker_command(c: PodConfig, config_file: str) -> list[str]:
    """A worker pod hosts sshd: its ranks are started by the leader's mpirun (through orted)."""
    return [c.sshd, "-D", "-e", "-f", config_file]


def python_models(c: PodConfig) -> dict[str, Path]:
    """model.py of TensorRT-LLM's pre/postprocessing models, which ship in the runtime image (the
    CPU reference model travels in the ConfigMap itself)."""
    if c.backend == "cpu-reference":
        return {}
    base = Path(c.trtllm_models_dir)
    return {
        m: base / m / "1" / "model.py" for m in TRTLLM_PYTHON_MODELS if (base / m / "1" / "model.py").exists()
    }


def engine_problems(c: PodConfig) -> list[str]:
    """What is wrong with the engine directory for this pod's ranks, before Triton fails on it
    with a less helpful message (worldConfig rejects an MPI size that is not the engine's tp*pp)."""
    engine = Path(c.engine_dir)
    if not (engine / "config.json").is_file():
        return [f"{engine}/config.json not found: is the engine cache mounted and the engine built?"]
    problems = [
        f"{engine}/rank{r}.engine not found"
        for r in range(c.world_size)
        if not (engine / f"rank{r}.engine").is_file()
    ]
    try:
        mapping = (
            json.loads((engine / "config.json").read_text()).get("pretrained_config", {}).get("mapping", {})
        )
    except (OSError, ValueError, AttributeError) as e:
        return [*problems, f"{engine}/config.json is unreadable: {e}"]
    for key, want in (("tp_size", c.tp), ("pp_size", c.pp)):
        if key in mapping and mapping[key] != want:
            problems.append(f"the engine was built with {key}={mapping[key]}, this pod runs {want}")
    return problems


# ---------------------------------------------------------------------------------------------
# What the StatefulSet builder needs (pure)


def container_command() -> list[str]:
    return [LAUNCHER]


def prestop_command() -> list[str]:
    return [LAUNCHER, "drain"]


def termination_grace_seconds(exit_timeout_seconds: int) -> int:
    """preStop drain + Triton's exit timeout + the launcher's SIGKILL grace, plus slack."""
    return int(float(ENV["LLMOP_DRAIN_TIMEOUT_SECONDS"]) + exit_timeout_seconds + KILL_GRACE_SECONDS + 5)


def pod_env(
    spec: LLMDeploymentSpec,
    pool: PoolPlan,
    *,
    engine_dir: str | None,
    model_repo_src: str = ENV["LLMOP_MODEL_REPO_SRC"],
    model_repo: str = ENV["LLMOP_MODEL_REPO"],
) -> list[dict[str, Any]]:
    """The env every serving container gets; multi-node pods add LLMOP_ROLE and the group
    addressing variables (docs/launcher-and-engines.md) for their shape (StatefulSet or LWS)."""

    def value(name: str, v: object) -> dict[str, Any]:
        return {"name": name, "value": str(v)}

    env = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        value("LLMOP_BACKEND", spec.engine.backend.value),
        value("LLMOP_TP", pool.tensor),
        value("LLMOP_PP", pool.pipeline),
        value("LLMOP_GPUS_PER_POD", pool.gpus_per_pod),
        value("LLMOP_PODS_PER_REPLICA", pool.pods_per_replica),
        value("LLMOP_MODEL_REPO_SRC", model_repo_src),
        value("LLMOP_MODEL_REPO", model_repo),
        value("LLMOP_HTTP_PORT", ENV["LLMOP_HTTP_PORT"]),
        value("LLMOP_GRPC_PORT", ENV["LLMOP_GRPC_PORT"]),
        value("LLMOP_METRICS_PORT", ENV["LLMOP_METRICS_PORT"]),
        value("LLMOP_EXIT_TIMEOUT_SECONDS", spec.runtime.exit_timeout_seconds),
    ]
    if engine_dir:
        env.append(value("LLMOP_ENGINE_DIR", engine_dir))
    return env


def ssh_secret_data() -> dict[str, str]:
    """A fresh key pair for one deployment's multi-node groups (Secret stringData, mounted at
    LLMOP_SSH_DIR in leaders and workers). Needs `cryptography`, which the operator image has."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return {SSH_KEY: private.decode(), f"{SSH_KEY}.pub": public.decode() + " llm-operator\n"}


# ---------------------------------------------------------------------------------------------
# Processes


def process_table(proc: Path = Path("/proc")) -> dict[int, tuple[int, list[str]]]:
    """pid -> (parent pid, argv) of every live process (zombies have no argv)."""
    table: dict[int, tuple[int, list[str]]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
        except (OSError, IndexError, ValueError):
            continue  # exited while we looked
        table[int(entry.name)] = (ppid, argv)
    return table


def descendants(table: Mapping[int, tuple[int, list[str]]], root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def rank_pids(table: Mapping[int, tuple[int, list[str]]], root: int, ranks: Iterable[str]) -> dict[str, int]:
    """Live rank processes under root, by --id. mpirun puts each rank in its own process group,
    so ranks are found in the process tree, not by signalling a group."""
    wanted = {f"--id={r}": r for r in ranks}
    found: dict[str, int] = {}
    for pid in descendants(table, root):
        ids = [arg for arg in table[pid][1] if arg.startswith("--id=")]
        if len(ids) == 1 and ids[0] in wanted:  # mpirun's own command line names every rank
            found[wanted[ids[0]]] = pid
    return found


class Policy(StrEnum):
    SERVER = "server"  # the child is the serving tritonserver itself
    RANK0_FIRST = "rank0-first"  # mpirun: stop rank 0, then the rest; any rank lost is fatal
    FOLLOW_LEADER = "follow-leader"  # worker: its ranks belong to the leader's mpirun, which stops them


class Stop:
    """SIGTERM/SIGINT, remembered from the launcher's first instruction on."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.signum = signum


def become_subreaper() -> None:
    """Orphaned ranks (after mpirun dies) are re-parented to us, so we can see, stop and reap
    them even when we are not PID 1."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def _log(message: str) -> None:
    print(f"{LAUNCHER}: {message}", file=sys.stderr, flush=True)


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
    poll: float = 0.2

    def run(self) -> int:
        me = os.getpid()
        try:
            child = os.posix_spawnp(self.argv[0], self.argv, dict(os.environ), setsid=True)
        except OSError as e:
            _log(f"cannot start {self.argv[0]}: {e}")
            return EXIT_NOT_FOUND
        status: int | None = None
        seen: dict[str, int] = {}
        cause, phase, deadline, killed = "", "", 0.0, False

        def signal_all(table: Mapping[int, tuple[int, list[str]]], sig: int) -> None:
            for pid in descendants(table, me):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)

        while True:
            reaped = self._reap(child)
            status = status if reaped is None else reaped
            table = process_table()
            if status is not None and not descendants(table, me):
                break
            live = rank_pids(table, me, self.ranks) if self.ranks else {}
            seen.update({r: p for r, p in live.items() if r not in seen})
            gone = [r for r in seen if r not in live] if self.policy == Policy.RANK0_FIRST else []
            now = time.monotonic()
            if not phase and (status is not None or gone):
                # Nobody asked: the server or a rank went away. Stop whatever is left of the world.
                cause = "exited" if status is not None else "lost"
                _log("the server exited" if status is not None else f"{gone[0]} exited: stopping the others")
                signal_all(table, signal.SIGTERM)
                phase, deadline = "terminating", now + KILL_GRACE_SECONDS
            elif not phase and self.stop.signum is not None:
                _log(f"signal {self.stop.signum}: stopping ({self.policy.value})")
                cause, phase, deadline = "stop", "draining", now + self.exit_timeout + KILL_GRACE_SECONDS
                if self.policy == Policy.SERVER:
                    os.kill(child, signal.SIGTERM)  # Triton waits up to its exit timeout for requests
                    phase = "terminating"
                elif self.policy == Policy.RANK0_FIRST and self.ranks[0] in live:
                    os.kill(live[self.ranks[0]], signal.SIGTERM)  # drains with the other ranks up
                elif self.policy == Policy.RANK0_FIRST:
                    signal_all(table, signal.SIGTERM)  # rank 0 is not running: nothing to drain
                    phase, deadline = "terminating", now + KILL_GRACE_SECONDS
            elif phase == "draining":
                drained = self.ranks[0] not in live if self.policy == Policy.RANK0_FIRST else not live
                if drained or now > deadline:
                    signal_all(table, signal.SIGTERM)
                    phase, deadline = "terminating", now + KILL_GRACE_SECONDS
            elif phase == "terminating" and now > deadline:
                _log("still running after the exit timeout: SIGKILL")
                signal_all(table, signal.SIGKILL)
                phase, killed = "killed", True
            time.sleep(self.poll)
        if cause == "stop":
            return 128 + signal.SIGKILL if killed else 0
        code = _exit_code(status)
        return code if cause != "lost" and code else EXIT_SERVER_GONE

    def _reap(self, child: int) -> int | None:
        """Reap every exited child (orphans included); the wait status of `child` if it exited."""
        status = None
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return status
            if pid == 0:
                return status
            if pid == child:
                status = st


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


# ---------------------------------------------------------------------------------------------
# Start-up steps (I/O)


def prepare_client_key(c: PodConfig) -> str:
    """A private copy of the Secret's key: ssh refuses keys other users can read."""
    Path(c.runtime_dir).mkdir(parents=True, exist_ok=True)
    key = Path(c.runtime_dir) / SSH_KEY
    key.write_bytes((Path(c.ssh_dir) / SSH_KEY).read_bytes())
    key.chmod(0o600)
    return str(key)


def prepare_sshd(c: PodConfig, environ: Mapping[str, str]) -> str:
    """Host key (fresh per start), authorized key from the Secret, config; returns the config path."""
    run = Path(c.runtime_dir)
    run.mkdir(parents=True, exist_ok=True)
    host_key = run / "ssh_host_ed25519_key"
    if not host_key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    authorized = run / "authorized_keys"
    authorized.write_bytes((Path(c.ssh_dir) / f"{SSH_KEY}.pub").read_bytes())
    config = run / "sshd_config"
    config.write_text(
        sshd_config(c, host_key=str(host_key), authorized_keys=str(authorized), environ=environ)
    )
    return str(config)


def wait_for_workers(hosts: list[str], port: int, timeout: float, stop: Stop) -> list[str]:
    """Block until every worker's sshd accepts connections (their DNS names appear once the pods
    run); returns the hosts still unreachable at the deadline or on SIGTERM."""
    deadline = time.monotonic() + timeout
    pending = list(hosts)
    while pending and time.monotonic() < deadline and stop.signum is None:
        for host in list(pending):
            try:
                socket.create_connection((host, port), timeout=2).close()
                pending.remove(host)
            except OSError:
                pass
        if pending:
            time.sleep(1)
    return pending


def inflight(metrics: str) -> float:
    """Requests queued in Triton or active in TensorRT-LLM's batcher (a python/ensemble request
    leaves Triton's queue when it reaches the backend, so the queue alone under-counts)."""
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith("nv_inference_pending_request_count{") or (
            line.startswith("nv_trt_llm_request_metrics{")
            and ('request_type="active"' in line or 'request_type="waiting"' in line)
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


def drain(c: PodConfig, poll: float = 0.5) -> int:
    """preStop: give endpoint removal time to reach every proxy, then wait (bounded) until nothing
    is in flight on rank 0. Workers wait on their leader, so their ranks outlive its requests."""
    start = time.monotonic()
    host = c.leader_host if c.role == "worker" else "127.0.0.1"
    time.sleep(min(c.drain_settle, c.drain_timeout))
    if not host:
        return 0
    while True:
        try:
            url = f"http://{host}:{c.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=2) as response:
                pending = inflight(response.read().decode())
        except (OSError, ValueError):
            return 0  # not serving (any more): nothing to wait for
        if pending == 0:
            return 0
        if time.monotonic() - start >= c.drain_timeout:
            _log(f"drain: {pending:g} requests still in flight after {c.drain_timeout:g}s; stopping anyway")
            return 0
        time.sleep(poll)


def _resolve(c: PodConfig) -> PodConfig:
    """Absolute binaries: remote ranks run the same path, and --prefix is derived from mpirun's."""
    tritonserver, mpirun = shutil.which(c.tritonserver), shutil.which(c.mpirun)
    return replace(
        c,
        tritonserver=tritonserver or c.tritonserver,
        mpirun=os.path.realpath(mpirun) if mpirun else c.mpirun,
    )


def launch(c: PodConfig, stop: Stop, environ: Mapping[str, str]) -> int:
    materialize(c.model_repo_src, c.model_repo, python_models(c))
    if c.backend == "tensorrt-engine" and c.engine_dir:
        problems = engine_problems(c)
        for problem in problems:
            _log(problem)
        if problems:
            return EXIT_CONFIG
    c = _resolve(c)
    ids = tuple(rank_id(r) for r in c.local_ranks)
    if c.role == "worker":
        argv = worker_command(c, prepare_sshd(c, environ))
        _log(f"worker of group {c.group}: sshd on port {c.ssh_port} for the leader's mpirun")
        return Supervisor(argv, Policy.FOLLOW_LEADER, c.exit_timeout, stop, ids).run()
    key = ""
    if c.multi_node:
        key = prepare_client_key(c)
        missing = wait_for_workers(worker_hosts(c), c.ssh_port, c.worker_wait, stop)
        if stop.signum is not None:
            return 0
        if missing:
            _log(f"workers unreachable after {c.worker_wait:g}s on port {c.ssh_port}: {', '.join(missing)}")
            return EXIT_WORKERS_UNREACHABLE
    argv = serve_command(c, ssh_key=key)
    _log(shlex.join(argv))
    if c.world_size == 1:
        return Supervisor(argv, Policy.SERVER, c.exit_timeout, stop).run()
    return Supervisor(argv, Policy.RANK0_FIRST, c.exit_timeout, stop, ids).run()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["drain"]):
        print(f"usage: {LAUNCHER} [drain]", file=sys.stderr)
        return EXIT_USAGE
    try:
        c = PodConfig.from_env(os.environ)
    except ConfigError as e:
        _log(str(e))
        return EXIT_CONFIG
    if args == ["drain"]:
        return drain(c)
    stop = Stop()
    stop.install()
    become_subreaper()
    return launch(c, stop, os.environ)


if __name__ == "__main__":
    sys.exit(main())
