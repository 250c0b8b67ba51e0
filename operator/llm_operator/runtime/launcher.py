"""`llm-operator-launch`: the process Kubernetes watches in every serving pod.

It checks that every file the repository loads is there (preflight.py), materializes the model
repository from the ConfigMap, checks the engine's tp/pp (and turns the guided decoder off for an
engine without a tokenizer info file it can load), starts this pod's Triton ranks (a worker: the
launch agent for its leader's mpirun) and supervises them (supervisor.py); `llm-operator-launch drain` is the
preStop hook (drain.py). The environment it reads is contract.ENV, parsed by config.py.
docs/launcher-and-engines.md documents all of it.

Serving images install this package without its dependencies: the runtime imports only the
standard library, llm_operator.contract and prometheus_client (tests/unit/test_dependencies.py).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import shutil
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from llm_operator.contract import (
    ADMIN_KEY_ENV,
    ADMIN_KEY_FD_ENV,
    ENV,
    LAUNCHER,
    XGRAMMAR_TOKENIZER_INFO,
    tokenizer_info_problem,
)
from llm_operator.runtime.commands import (
    engine_problems,
    rank_id,
    rank_places,
    redacted,
    serve_command,
    worker_command,
    worker_hosts,
)
from llm_operator.runtime.config import ConfigError, PodConfig
from llm_operator.runtime.drain import drain
from llm_operator.runtime.preflight import first_missing, image_files
from llm_operator.runtime.processes import remove_orphaned_shm
from llm_operator.runtime.repository import materialize, without_guided_decoding
from llm_operator.runtime.startup_cache import drop_unreadable
from llm_operator.runtime.supervisor import (
    LAUNCHER_PID_FILE,
    Policy,
    Stop,
    Supervisor,
    become_subreaper,
    log,
    termination_message,
)

# Exit statuses of a launcher that could not start its servers (supervisor.py has the others).
EXIT_USAGE = 64
EXIT_WORKERS_UNREACHABLE = 69  # multi-node leader: workers' launch agents never answered
# The environment is inconsistent or a file the repository loads is missing (preflight.py):
# restarting will not help. The operator reports it as Stalled (LauncherRefused).
EXIT_CONFIG = 78


# A worker whose address lets every connection time out for this long is cut off from its leader
# (a NetworkPolicy between the group's pods, a node gone): a pod that is still starting (pulling its
# image, its launch agent not yet listening) refuses at once instead, and waiting out
# LLMOP_WORKER_WAIT_SECONDS would only hide the cause for ten minutes.
DROPPED_SECONDS = 60.0
CONNECT_TIMEOUT_SECONDS = 2.0
# A worker's name that does not resolve while the group's headless Service lists this pod is a worker
# not created or scheduled yet: wait for it. When the Service does not list this pod either (no such
# Service, a ClusterIP Service of that name, cluster DNS not answering), no worker's name ever will:
# say so after this long instead of waiting out LLMOP_WORKER_WAIT_SECONDS. This pod's own record
# appears seconds after it gets its address (publishNotReadyAddresses).
UNLISTED_SECONDS = 60.0


def _addresses(name: str) -> set[str]:
    return {str(info[4][0]) for info in socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)}


def own_addresses() -> frozenset[str]:
    """This pod's addresses, both families, from the /etc/hosts the kubelet writes (the pod's name
    -> its IPs)."""
    try:
        return frozenset(_addresses(socket.gethostname()))
    except OSError:
        return frozenset()


def _family(address: str) -> int:
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def subdomain_problem(host: str, own: frozenset[str]) -> str | None:
    """Why no worker of `host`'s group can resolve, if the group's subdomain (the headless Service
    the pods' names live under: `host` less its first label) shows it; None when it lists this pod,
    or when it resolves and cannot tell (this pod's address unknown, or none of its family: a
    single-stack IPv6 Service of a dual-stack pod answers AAAA records only)."""
    domain = host.partition(".")[2]
    if not domain:
        return None
    try:
        listed = _addresses(domain)
    except socket.gaierror as e:
        return (f"neither does {domain}, the group's headless Service ({e.strerror}): the Service is "
                "missing or cluster DNS does not answer")  # fmt: skip
    mine = {a for a in own if _family(a) in {_family(b) for b in listed}}
    if mine and not listed & mine:
        return (f"{domain} answers {', '.join(sorted(listed))}, not this pod's {', '.join(sorted(mine))}: "
                "a Service of that name that is not the group's headless one")  # fmt: skip
    return None


def wait_for_workers(
    hosts: list[str],
    port: int,
    timeout: float,
    stop: Stop,
    dropped: float = DROPPED_SECONDS,
    own: frozenset[str] = frozenset(),
    unlisted: float = UNLISTED_SECONDS,
) -> dict[str, str]:
    """Block until every worker's launch agent accepts connections (their DNS names appear once the pods
    run). Returns each host still unreachable, with why, at the deadline, on SIGTERM, or as soon as
    one has dropped every connection for `dropped` seconds or its name has not resolved for
    `unlisted` seconds while the group's subdomain does not list this pod (`own`) either."""
    deadline = time.monotonic() + timeout
    pending: dict[str, str] = dict.fromkeys(hosts, "not tried")
    dropping: dict[str, float] = {}  # host -> since when every connection to it timed out
    unresolved: dict[str, float] = {}  # host -> since when its name and its subdomain fail to resolve
    while pending and time.monotonic() < deadline and stop.signum is None:
        problems: dict[str, str | None] = {}  # subdomain -> its problem, looked up once a pass
        for host in list(pending):
            try:
                socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_SECONDS).close()
                del pending[host]
                continue
            except socket.gaierror as e:
                pending[host] = f"does not resolve ({e.strerror})"
                domain = host.partition(".")[2]
                if domain not in problems:
                    problems[domain] = subdomain_problem(host, own)
                problem = problems[domain]
                if problem is not None:
                    pending[host] += f"; {problem}"
                    if time.monotonic() - unresolved.setdefault(host, time.monotonic()) >= unlisted:
                        return pending
                    continue
            except TimeoutError:
                waited = time.monotonic() - dropping.setdefault(host, time.monotonic())
                pending[host] = (f"every connection timed out for {waited:.0f} s (a pod still starting "
                                 "refuses at once): a NetworkPolicy between the group's pods, or its node "
                                 "unreachable")  # fmt: skip
                if waited >= dropped:
                    return pending
                continue
            except OSError as e:
                pending[host] = e.strerror or type(e).__name__
            dropping.pop(host, None)
            unresolved.pop(host, None)
        if pending:
            time.sleep(1)
    return pending


def _resolve(c: PodConfig) -> PodConfig:
    """Absolute binaries: remote ranks run the same path, --prefix is derived from mpirun's, and the
    leader's mpirun runs its launch agent with this interpreter."""
    tritonserver, mpirun = shutil.which(c.tritonserver), shutil.which(c.mpirun)
    llmapi_launch = shutil.which(c.llmapi_launch)
    return replace(
        c,
        tritonserver=tritonserver or c.tritonserver,
        mpirun=os.path.realpath(mpirun) if mpirun else c.mpirun,
        llmapi_launch=llmapi_launch or c.llmapi_launch,
        python=sys.executable,
    )


def launch(c: PodConfig, stop: Stop, environ: Mapping[str, str]) -> int:
    absent = first_missing(c)
    if absent is not None:
        log(absent)
        return EXIT_CONFIG
    materialize(c.model_repo_src, c.model_repo, image_files(c))
    if removed := remove_orphaned_shm():  # a relaunch in place: what the ended run left there
        log(f"removed {len(removed)} file(s) an earlier run left in /dev/shm")
    for line in drop_unreadable(environ):
        log(line)
    if c.backend == "tensorrt-engine" and c.engine_dir:
        problems = engine_problems(c)
        for problem in problems:
            log(problem)
        if problems:
            return EXIT_CONFIG
        unusable = tokenizer_info_problem(Path(c.engine_dir, XGRAMMAR_TOKENIZER_INFO))
        if unusable:  # the backend would fail the model's load on it
            log(
                f"{unusable}: serving without a guided decoder (an engine built before the operator "
                "wrote the file, or a prebuilt one without a usable one); the front door refuses "
                "response_format and tool_choice required or named until it is there (docs/serving-api.md)"
            )
            without_guided_decoding(c.model_repo)
    c = _resolve(c)
    ids = tuple(rank_id(r) for r in c.local_ranks)
    if c.role == "worker":
        log(f"worker of group {c.group}: the launch agent on port {c.launch_port} for the leader's mpirun")
        run = Path(c.runtime_dir)
        run.mkdir(mode=0o700, parents=True, exist_ok=True)
        (run / LAUNCHER_PID_FILE).write_text(str(os.getpid()))  # for the preStop (drain.py)
        return Supervisor(worker_command(c), Policy.FOLLOW_LEADER, c.exit_timeout, stop, ids,
                          name="the launch agent").run()  # fmt: skip
    if c.multi_node:
        missing = wait_for_workers(worker_hosts(c), c.launch_port, c.worker_wait, stop, own=own_addresses())
        if stop.signum is not None:
            return 0
        if missing:
            why = "; ".join(f"{host}: {reason}" for host, reason in missing.items())
            log(f"workers unreachable on port {c.launch_port} (waiting up to {c.worker_wait:g}s): {why}")
            return EXIT_WORKERS_UNREACHABLE
    if not c.admin_key:
        # No Secret's key (a pod not rendered by the operator): the admin APIs stay restricted,
        # to a key nobody holds.
        c = replace(c, admin_key=secrets.token_hex(32))
        log(f"{ADMIN_KEY_ENV} is not set: Triton's admin APIs are closed to every request")
    argv = serve_command(c)
    log(shlex.join(redacted(argv, c.admin_key)))
    companions = frontdoor_command(c)
    if c.world_size == 1 and c.backend != "pytorch":  # pytorch: tritonserver under mpirun
        return Supervisor(argv, Policy.SERVER, c.exit_timeout, stop, companions=companions).run()
    # Under trtllm-llmapi-launch, mpirun's and the wrapper's command lines name rank 0 too.
    wrappers = (c.llmapi_launch,) if c.llmapi_launch in argv else ()
    return Supervisor(argv, Policy.RANK0_FIRST, c.exit_timeout, stop, ids, companions=companions,
                      wrappers=wrappers, places=rank_places(c, socket.gethostname())).run()  # fmt: skip


def frontdoor_command(c: PodConfig) -> tuple[tuple[str, ...], ...]:
    """The OpenAI front door, where the pod names what it serves (the operator sets the names on
    leaders only): this interpreter runs it, with the image's jinja2 and tokenizers."""
    if c.role != "leader" or not c.served_model_names:
        return ()
    return ((sys.executable, "-m", "llm_operator.frontdoor"),)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["drain"]):
        print(f"usage: {LAUNCHER} [drain]", file=sys.stderr)
        return EXIT_USAGE
    handed = os.environ.pop(ADMIN_KEY_FD_ENV, None)
    environ = os.environ if handed is None else {**os.environ, ADMIN_KEY_ENV: _read_key(int(handed))}
    try:
        c = PodConfig.from_env(environ)
    except ConfigError as e:
        log(str(e))
        _last_words(os.environ.get("LLMOP_TERMINATION_LOG") or ENV["LLMOP_TERMINATION_LOG"])
        return EXIT_CONFIG
    if args == ["drain"]:
        return drain(c)
    if ADMIN_KEY_ENV in os.environ:
        _again_without_the_key(os.environ.pop(ADMIN_KEY_ENV))
    stop = Stop()
    stop.install()
    become_subreaper()
    code = launch(c, stop, os.environ)
    if code != 0:
        _last_words(c.termination_log)
    return code


def _again_without_the_key(key: str) -> None:
    """Run this launcher again (same PID) from an environment without the admin key, handing the
    key over a pipe: the environment a process started with stays readable for as long as it runs
    (/proc/PID/environ; os.environ.pop changes only the interpreter's copy), and any process of
    the container's user, the front door among them, can read it. Triton, its backends and a
    worker's launch agent (and so the leader's ranks there) inherit the cleaned environment too."""
    read, write = os.pipe()
    os.write(write, key.encode())
    os.close(write)
    os.set_inheritable(read, True)
    os.execve(sys.executable, sys.orig_argv, {**os.environ, ADMIN_KEY_FD_ENV: str(read)})


def _read_key(fd: int) -> str:
    with os.fdopen(fd, "rb") as pipe:
        return pipe.read().decode()


def _last_words(path: str) -> None:
    """Why this container failed, where Kubernetes reads its termination message (`kubectl get
    pod` and the LLMDeployment's status show it), since the log may be long gone by then."""
    with contextlib.suppress(OSError):  # not in a pod, or no such file there
        Path(path).write_text(termination_message())


if __name__ == "__main__":
    sys.exit(main())
