"""The serving-pod launcher: command construction for each parallel shape (pure), and supervision
of real processes: fake tritonservers under a fake mpirun, real Open MPI where installed, and the
real Triton CPU runtime (triton marker). The launch agent of multi-node pods is in test_launch_agent.py."""

from __future__ import annotations

import dataclasses
import http.client as http_client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.contract import ADMIN_KEY_ENV, ADMIN_KEY_HEADER, KILL_GRACE_SECONDS, XGRAMMAR_TOKENIZER_INFO
from llm_operator.runtime import launcher, processes, supervisor
from llm_operator.runtime.commands import (
    engine_problems,
    redacted,
    serve_command,
    worker_hosts,
)
from llm_operator.runtime.config import ConfigError, PodConfig
from llm_operator.runtime.drain import drain, inflight
from llm_operator.runtime.supervisor import EXIT_SERVER_GONE

from e2e.cluster.processes import free_port
from tests import upstream_names as up
from tests.unit.launch_identities import launch, role_dirs, wait_listening

PYTHON = sys.executable


def config(**env: str) -> PodConfig:
    return PodConfig.from_env({"LLMOP_MODEL_REPO": "/repo", **env})


def ranks(cmd: list[str]) -> list[list[str]]:
    """Split an MPMD mpirun line into the per-rank tritonserver commands."""
    body = cmd[cmd.index("-n") :]
    segments: list[list[str]] = []
    current: list[str] = []
    for token in [*body, ":"]:
        if token == ":":
            assert current[:2] == ["-n", "1"]
            segments.append(current[2:])
            current = []
        else:
            current.append(token)
    return segments


def option(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


# --- command construction -------------------------------------------------------------------


def test_tp1_runs_tritonserver_directly_serving_every_endpoint() -> None:
    cmd = serve_command(config())
    assert cmd[0] == "tritonserver" and "mpirun" not in cmd
    serving_flags = ["--http-port=8000", "--grpc-port=8001", "--metrics-port=8002", "--allow-metrics=true",
                     "--metrics-interval-ms=1000", "--exit-timeout-secs=30", "--model-repository=/repo",
                     "--disable-auto-complete-config",
                     "--backend-config=python,shm-region-prefix-name=rank0_",
                     # latency quantiles and TTFT histogram for dashboards and autoscaling
                     "--metrics-config=summary_latencies=true",
                     "--metrics-config=histogram_latencies=true"]  # fmt: skip
    for flag in serving_flags:
        assert flag in cmd


def test_cpu_backend_is_one_tritonserver_without_gpu_metrics() -> None:
    cmd = serve_command(config(LLMOP_BACKEND="cpu-reference", LLMOP_HTTP_PORT="9000", LLMOP_BACKEND_DIR="/b"))
    assert (
        "--http-port=9000" in cmd and "--allow-gpu-metrics=false" in cmd and "--backend-directory=/b" in cmd
    )


@pytest.mark.parametrize(("tp", "pp"), [(4, 1), (2, 2)])
def test_single_node_world_is_one_mpmd_mpirun_with_rank0_serving(tp: int, pp: int) -> None:
    cmd = serve_command(config(LLMOP_TP=str(tp), LLMOP_PP=str(pp), LLMOP_GPUS_PER_POD="4"))
    assert cmd[0] == "mpirun" and cmd.count("mpirun") == 1
    assert option(cmd, "--host") == "localhost:4" and option(cmd, "--map-by") == "slot"
    per_rank = ranks(cmd)
    assert len(per_rank) == tp * pp == 4
    assert "--http-port=8000" in per_rank[0] and "--load-model=tensorrt_llm" not in per_rank[0]
    for i, rank in enumerate(per_rank):
        assert f"--id=rank{i}" in rank and "--exit-timeout-secs=30" in rank
        assert f"--backend-config=python,shm-region-prefix-name=rank{i}_" in rank
        assert "--disable-auto-complete-config" in rank
        if i:
            for flag in ("--allow-http=false", "--allow-grpc=false", "--allow-metrics=false",
                         "--model-control-mode=explicit", "--load-model=tensorrt_llm"):  # fmt: skip
                assert flag in rank
            assert not any(a.startswith("--http-port") for a in rank)


MULTI = {"LLMOP_TP": "8", "LLMOP_PP": "2", "LLMOP_GPUS_PER_POD": "8", "LLMOP_PODS_PER_REPLICA": "2",
         "LLMOP_GROUP_INDEX": "3", "LLMOP_WORKER_HOST_PATTERN": "m-g{group}-{worker}.m-pods.ns.svc",
         "LLMOP_MPIRUN": "/opt/hpcx/ompi/bin/mpirun"}  # fmt: skip


def test_multi_node_leader_runs_sixteen_ranks_eight_per_pod_through_the_launch_agent() -> None:
    leader = config(LLMOP_ROLE="leader", **MULTI)
    assert worker_hosts(leader) == ["m-g3-1.m-pods.ns.svc"]
    assert list(leader.local_ranks) == list(range(8))
    cmd = serve_command(leader)
    assert option(cmd, "--host") == "localhost:8,m-g3-1.m-pods.ns.svc:8"
    assert option(cmd, "--prefix") == "/opt/hpcx/ompi"
    # Workers' daemons start through their launch agent, run by this pod's Python (no ssh).
    assert mca(cmd)["plm_rsh_agent"] == "python3 -m llm_operator.runtime.launch_agent"
    assert "plm_rsh_args" not in mca(cmd)
    assert mca(cmd)["plm_rsh_no_tree_spawn"] == "1"
    assert mca(cmd)["odls_base_sigkill_timeout"] == "0"  # a broken world is killed at once
    per_rank = ranks(cmd)
    assert len(per_rank) == 16
    assert sum("--http-port=8000" in r for r in per_rank) == 1


def mca(cmd: list[str]) -> dict[str, str]:
    """mpirun's `--mca NAME VALUE` settings."""
    return {cmd[i + 1]: cmd[i + 2] for i, token in enumerate(cmd) if token == "--mca"}


def test_mpirun_across_pods_uses_open_mpis_ob1_not_ucx_and_one_pod_keeps_the_default() -> None:
    """Pods get no RDMA devices: across pods, Open MPI's ob1 PML (TCP), as Dynamo's operator forces."""
    across = mca(serve_command(config(LLMOP_ROLE="leader", **MULTI)))
    assert across["pml"] == "ob1"
    assert across["orte_keep_fqdn_hostnames"] == "1"
    one_pod = serve_command(config(LLMOP_TP="4", LLMOP_GPUS_PER_POD="4"))
    assert one_pod[0] == "mpirun" and "pml" not in mca(one_pod)


KEY = "0123abcd" * 8


def restricted(rank: list[str]) -> dict[str, str]:
    """The restriction flags of one rank: flag -> its APIS:HEADER=KEY setting."""
    flags = ("--http-restricted-api", "--grpc-restricted-protocol")
    return {a.split("=", 1)[0]: a.split("=", 1)[1] for a in rank if a.split("=", 1)[0] in flags}


@pytest.mark.parametrize("env", [{}, {"LLMOP_BACKEND": "cpu-reference"}, {**MULTI, "LLMOP_ROLE": "leader"},
                                 {"LLMOP_TP": "2", "LLMOP_PP": "2", "LLMOP_GPUS_PER_POD": "4"}],
                         ids=["tp1", "cpu", "multi-node", "tp2pp2"])  # fmt: skip
def test_rank0_alone_restricts_the_admin_apis_on_http_and_grpc(env: dict[str, str]) -> None:
    cmd = serve_command(config(LLMOP_ADMIN_KEY=KEY, **env))
    per_rank = ranks(cmd) if cmd[0] != "tritonserver" else [cmd]
    # Not inference (infer, generate), health (probes), metadata, model-config, statistics.
    setting = f"model-repository,shared-memory,logging,trace:{ADMIN_KEY_HEADER}={KEY}"
    assert restricted(per_rank[0]) == {
        "--http-restricted-api": setting,
        "--grpc-restricted-protocol": setting,
    }
    assert all(restricted(r) == {} for r in per_rank[1:]), "ranks > 0 serve no HTTP or gRPC"


def test_the_admin_key_is_never_printed_and_a_malformed_one_is_refused_unechoed() -> None:
    assert KEY not in repr(config(LLMOP_ADMIN_KEY=KEY))
    argv = serve_command(config(LLMOP_ADMIN_KEY=KEY))
    assert KEY not in " ".join(redacted(argv, KEY)) and len(redacted(argv, KEY)) == len(argv)
    with pytest.raises(ConfigError, match=ADMIN_KEY_ENV) as refused:
        config(LLMOP_ADMIN_KEY="s3cret:x=y")
    assert "s3cret" not in str(refused.value)


@pytest.mark.parametrize("key", [KEY, ""], ids=["from-secret", "unset"])
def test_the_launcher_hands_triton_the_key_in_argv_only_and_logs_it_redacted(
    tmp_path: Path, key: str
) -> None:
    (tmp_path / "cm").mkdir()
    env = {**os.environ, "FAKE_DIR": str(tmp_path), "LLMOP_BACKEND": "cpu-reference",
           "LLMOP_TRITONSERVER": script(tmp_path / "tritonserver", FAKE_TRITON),
           "LLMOP_MODEL_REPO_SRC": str(tmp_path / "cm"), "LLMOP_MODEL_REPO": str(tmp_path / "repo"),
           "LLMOP_EXIT_TIMEOUT_SECONDS": "1", ADMIN_KEY_ENV: key}  # fmt: skip
    log = tmp_path / "launcher.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [PYTHON, "-m", "llm_operator.runtime.launcher"], env=env, stdout=out, stderr=out
        )
    try:
        Pod(tmp_path, proc).wait_started("rank0")
        server = Pod(tmp_path, proc).pid("rank0")
        argv = Path(f"/proc/{server}/cmdline").read_bytes().decode().split("\0")
        environ = Path(f"/proc/{server}/environ").read_bytes().decode()
        # The launcher itself ran again without it: its startup environment (what any process of
        # the container's user can read) holds no key either.
        launcher = Path(f"/proc/{proc.pid}/environ").read_bytes().decode()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    (setting,) = {v for v in restricted(argv).values()}
    given = setting.rsplit("=", 1)[1]
    assert given == key if key else len(given) == 64, "unset: a random key nobody holds"
    assert ADMIN_KEY_ENV not in environ, "Triton and its backends do not inherit it"
    names = {entry.partition("=")[0] for entry in launcher.split("\0")}
    assert ADMIN_KEY_ENV not in names and (not key or key not in launcher), "nor /proc/1/environ"
    text = log.read_text()
    assert "--http-restricted-api=" in text and given not in text, text


@pytest.mark.parametrize(
    ("env", "message"),
    [({"LLMOP_BACKEND": "vllm"}, "LLMOP_BACKEND"),
     ({"LLMOP_TP": "8", "LLMOP_GPUS_PER_POD": "4"}, "need 8 GPUs"),
     ({**MULTI, "LLMOP_GPUS_PER_POD": "4"}, "must equal"),
     ({**MULTI, "LLMOP_WORKER_HOST_PATTERN": ""}, "LLMOP_WORKER_HOST_PATTERN"),
     ({"LLMOP_ROLE": "worker"}, "PODS_PER_REPLICA > 1"),
     ({"LLMOP_BACKEND": "cpu-reference", "LLMOP_TP": "2", "LLMOP_GPUS_PER_POD": "2"}, "one process"),
     ({"LLMOP_GPUS_PER_POD": "0"}, "needs >= 1"),
     ({"LLMOP_PODS_PER_REPLICA": "0"}, "must be >= 1"),
     ({"LLMOP_TP": "two"}, "not an integer")],
)  # fmt: skip
def test_inconsistent_environment_is_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config(**env)


def test_cpu_reference_pod_as_the_operator_renders_it_has_no_gpu() -> None:
    c = config(LLMOP_BACKEND="cpu-reference", LLMOP_GPUS_PER_POD="0")
    assert c.gpus_per_pod == 0 and c.world_size == 1


def test_an_engine_built_for_another_world_is_refused(tmp_path: Path) -> None:
    c = config(LLMOP_TP="2", LLMOP_GPUS_PER_POD="2", LLMOP_ENGINE_DIR=str(tmp_path))
    assert engine_problems(c)[0].startswith(f"{tmp_path}/config.json is unreadable")
    (tmp_path / "config.json").write_text('{"pretrained_config": {"mapping": {"tp_size": 4, "pp_size": 1}}}')
    assert engine_problems(c) == ["the engine was built with tp_size=4, this pod runs 2"]
    (tmp_path / "config.json").write_text('{"pretrained_config": {"mapping": {"tp_size": 2, "pp_size": 1}}}')
    assert engine_problems(c) == []


def test_inflight_counts_the_queue_and_trtllm_active_requests() -> None:
    metrics = """# HELP x
nv_inference_pending_request_count{model="ensemble",version="1"} 0
nv_inference_pending_request_count{model="tensorrt_llm",version="1"} 0
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 64
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 3
"""
    assert inflight(metrics) == 3
    assert inflight(metrics.replace("} 3", "} 0")) == 0


def test_ranks_are_found_by_their_own_id_not_by_mpiruns_command_line() -> None:
    table = {
        10: (1, ["mpirun", "-n", "1", "ts", "--id=rank0", ":", "-n", "1", "ts", "--id=rank1"]),
        11: (10, ["ts", "--id=rank0", "--http-port=8000"]),
        12: (10, []),  # a zombie
        13: (99, ["ts", "--id=rank0"]),  # not ours
    }
    assert sorted(processes.descendants(table, 1)) == [10, 11, 12]
    assert processes.rank_pids(table, 1, ["rank0"]) == {"rank0": 11}
    del table[11]
    assert processes.rank_pids(table, 1, ["rank0"]) == {}, "mpirun alone is not rank 0"


def test_a_rank_is_its_process_through_an_exec_until_that_process_is_gone() -> None:
    """The launch wrapper becomes the server by exec: for an instant its command line reads empty,
    and a rank taken for lost stops the whole world (a starting group recreated for nothing)."""
    mpirun = (1, ["mpirun", "-n", "1", "wrap", "ts", "--id=rank0"])
    watch = processes.RankWatch(("rank0",), ("wrap",))
    table = {10: mpirun, 11: (10, ["python3", "-m", "launch", "ts", "--id=rank0"])}
    assert watch.update(table, 1) == ({"rank0": 11}, [])
    assert watch.update({10: mpirun, 11: (10, [])}, 1) == ({"rank0": 11}, []), "mid-exec: still rank 0"
    running = {10: mpirun, 11: (10, ["ts", "--id=rank0"]), 12: (11, ["ts", "--id=rank0"])}
    assert watch.update(running, 1) == ({"rank0": 11}, []), "its fork is not the rank"
    assert watch.update({10: mpirun, 12: (1, ["ts", "--id=rank0"])}, 1) == ({}, ["rank0"])


def test_rank_pids_takes_the_rank_not_its_fork_in_any_order() -> None:
    for order in ([11, 12], [12, 11]):
        argv = ["ts", "--id=rank0"]
        table = {10: (1, ["mpirun"]), **{pid: (10 if pid == 11 else 11, argv) for pid in order}}
        assert processes.rank_pids(table, 1, ["rank0"]) == {"rank0": 11}


def test_process_table_keeps_a_process_without_argv_and_leaves_zombies_out(tmp_path: Path) -> None:
    for pid, state, argv in ((20, "R", b""), (21, "Z", b""), (22, "S", b"ts\0--id=rank0\0")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (t s) {state} 1 {pid} {pid} 0 -1\n")
        (tmp_path / str(pid) / "cmdline").write_bytes(argv)
    (tmp_path / "self").mkdir()
    assert processes.process_table(tmp_path) == {20: (1, []), 22: (1, ["ts", "--id=rank0"])}


class Metrics:
    """A /metrics endpoint whose in-flight count the test sets."""

    def __init__(self) -> None:
        import http.server
        import threading

        self.pending = 0
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = f'nv_inference_pending_request_count{{model="ensemble",version="1"}} {owner.pending}\n'
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *_: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_drain_waits_for_in_flight_requests_within_its_budget() -> None:
    metrics = Metrics()
    try:
        metrics.pending = 2
        c = config(LLMOP_METRICS_PORT=str(metrics.port), LLMOP_DRAIN_SETTLE_SECONDS="0",
                   LLMOP_DRAIN_TIMEOUT_SECONDS="1")  # fmt: skip
        start = time.monotonic()
        assert drain(c, poll=0.05) == 0
        assert 1 <= time.monotonic() - start < 3, "bounded by the drain timeout"
        c = dataclasses.replace(c, drain_timeout=10)
        import threading

        threading.Timer(0.5, lambda: setattr(metrics, "pending", 0)).start()
        start = time.monotonic()
        assert drain(c, poll=0.05) == 0
        assert 0.4 < time.monotonic() - start < 3, "returns once nothing is in flight"
        worker = config(**MULTI, LLMOP_ROLE="worker", LLMOP_LEADER_HOST="127.0.0.1",
                        LLMOP_METRICS_PORT=str(metrics.port), LLMOP_DRAIN_SETTLE_SECONDS="0")  # fmt: skip
        metrics.pending = 1
        threading.Timer(0.5, lambda: setattr(metrics, "pending", 0)).start()
        start = time.monotonic()
        assert drain(worker, poll=0.05) == 0
        assert time.monotonic() - start > 0.4, "a worker waits on its leader's requests"
    finally:
        metrics.server.shutdown()
    gone = config(LLMOP_METRICS_PORT=str(free_port()), LLMOP_DRAIN_SETTLE_SECONDS="0")
    assert drain(gone) == 0, "nothing serving: nothing to drain"


@pytest.mark.parametrize(
    ("env", "argv", "code"),
    [({"LLMOP_TP": "x"}, [], launcher.EXIT_CONFIG),
     ({}, ["serve"], launcher.EXIT_USAGE),
     ({"LLMOP_TP": "2", "LLMOP_GPUS_PER_POD": "2", "LLMOP_ENGINE_DIR": "/none"}, [], launcher.EXIT_CONFIG),
     ({**MULTI, "LLMOP_WORKER_HOST_PATTERN": "127.0.0.{worker}", "LLMOP_WORKER_WAIT_SECONDS": "1",
       "LLMOP_LAUNCH_PORT": "1"}, [], launcher.EXIT_WORKERS_UNREACHABLE)],
    ids=["bad-env", "usage", "no-engine", "workers-unreachable"],
)  # fmt: skip
def test_launcher_refuses_to_start_with_a_meaningful_status(
    tmp_path: Path, env: dict[str, str], argv: list[str], code: int
) -> None:
    (tmp_path / "cm").mkdir()
    paths = {"LLMOP_MODEL_REPO_SRC": str(tmp_path / "cm"), "LLMOP_MODEL_REPO": str(tmp_path / "r"),
             "LLMOP_RUNTIME_DIR": str(tmp_path / "run")}  # fmt: skip
    full = {**os.environ, **paths, **env}
    result = subprocess.run([PYTHON, "-m", "llm_operator.runtime.launcher", *argv], env=full, timeout=30,
                            capture_output=True, text=True)  # fmt: skip
    assert result.returncode == code, result.stderr
    if code == launcher.EXIT_WORKERS_UNREACHABLE:  # each worker named, with why
        assert "127.0.0.1: Connection refused" in result.stderr, result.stderr


def test_a_worker_that_drops_every_connection_is_reported_before_the_wait_ends() -> None:
    """A full accept queue drops SYNs as a NetworkPolicy does: connections time out, where a pod
    still starting refuses at once. The leader says so after `dropped` seconds, not the whole wait;
    refused and unresolvable workers are waited for, each with its reason."""
    with socket.socket() as dropping:
        dropping.bind(("127.0.0.1", 0))
        dropping.listen(0)
        port = dropping.getsockname()[1]
        queued = []
        while True:  # fill the queue: the next connection times out
            client = socket.socket()
            client.settimeout(0.5)
            try:
                client.connect(("127.0.0.1", port))
            except TimeoutError:
                client.close()
                break
            queued.append(client)
        start = time.monotonic()
        found = launcher.wait_for_workers(["127.0.0.1"], port, 60, supervisor.Stop(), dropped=3)
        assert 3 <= time.monotonic() - start < 15, found
        assert re.fullmatch(r"every connection timed out for \d+ s .*NetworkPolicy.*", found["127.0.0.1"]), (
            found
        )
        for client in queued:
            client.close()
    start = time.monotonic()
    found = launcher.wait_for_workers(
        ["127.0.0.1", "worker.invalid"], free_port(), 2, supervisor.Stop(), dropped=1
    )
    assert time.monotonic() - start >= 2, "refusals and unresolved names are waited for: pods still starting"
    assert found == {"127.0.0.1": "Connection refused", "worker.invalid": found["worker.invalid"]}, found
    assert found["worker.invalid"].startswith("does not resolve ("), found


def test_a_worker_name_under_a_subdomain_not_listing_this_pod_is_reported_before_the_wait_ends() -> None:
    """A worker's name that does not resolve is a pod not created yet only while the group's
    headless Service lists the leader itself; otherwise (no such Service, DNS not answering, a
    ClusterIP Service of that name) no worker name ever resolves, and the leader says so after
    `unlisted` seconds, not the whole wait. Here with the machine's resolver: `.invalid` never
    resolves (RFC 6761)."""
    start = time.monotonic()
    found = launcher.wait_for_workers(["w1.pods.invalid"], free_port(), 120, supervisor.Stop(), unlisted=1)
    assert 1 <= time.monotonic() - start < 60, found
    why = found["w1.pods.invalid"]
    words = r"does not resolve \(.+\); neither does pods\.invalid, the group's headless Service \(.+\): "
    assert re.fullmatch(words + "the Service is missing or cluster DNS does not answer", why), why


# What the group's subdomain answers, in a cluster's DNS: a worker's own name does not resolve yet.
ZONE = {
    "pods.ns.svc": ["10.0.0.5"],  # the leader's own record: a headless Service
    "taken.ns.svc": ["10.96.0.12"],  # a ClusterIP Service of the headless Service's name
    "v6.ns.svc": ["fd00::5"],  # a single-stack IPv6 Service, the leader dual-stack
}


def _zone(host: str, *_: object, **__: object) -> list[tuple[object, ...]]:
    if host not in ZONE:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    return [
        (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, 0))
        for a in ZONE[host]
    ]


def test_the_subdomain_tells_a_worker_not_there_yet_from_a_name_that_never_resolves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(socket, "getaddrinfo", _zone)  # the resolver the launcher and create_connection use
    leader = frozenset({"10.0.0.5", "fd00::5"})
    taken = launcher.subdomain_problem("w1.taken.ns.svc", leader)
    assert taken == ("taken.ns.svc answers 10.96.0.12, not this pod's 10.0.0.5: a Service of that name that "
                     "is not the group's headless one"), taken  # fmt: skip
    assert launcher.subdomain_problem("w1.pods.ns.svc", leader) is None, "it lists the leader: wait"
    assert launcher.subdomain_problem("w1.pods.ns.svc", frozenset()) is None, "no address: resolving will do"
    assert launcher.subdomain_problem("w1.v6.ns.svc", frozenset({"10.0.0.5", "fd00::5"})) is None
    assert launcher.subdomain_problem("w1.v6.ns.svc", frozenset({"10.0.0.5"})) is None, "no family to compare"
    assert launcher.subdomain_problem("w1.pods.ns.svc", frozenset({"10.0.0.6"})) is not None
    start = time.monotonic()
    found = launcher.wait_for_workers(
        ["w1.pods.ns.svc"], free_port(), 2, supervisor.Stop(), own=leader, unlisted=0.5
    )
    assert time.monotonic() - start >= 2, f"a subdomain that lists this pod is waited on: {found}"
    start = time.monotonic()
    found = launcher.wait_for_workers(
        ["w1.taken.ns.svc"], free_port(), 60, supervisor.Stop(), own=leader, unlisted=1
    )
    assert 1 <= time.monotonic() - start < 10, found
    assert found["w1.taken.ns.svc"] == f"does not resolve (Name or service not known); {taken}", found


# --- supervision of real processes ----------------------------------------------------------

FAKE_TRITON = f"""#!{PYTHON}
# A tritonserver stand-in: records when it starts, gets SIGTERM and exits, per --id.
import os, pathlib, signal, sys, time
rid = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--id="))
out = pathlib.Path(os.environ["FAKE_DIR"])
def note(event):
    (out / f"{{rid}}.{{event}}").write_text(repr(time.monotonic()))
def on_term(*_):
    note("term")
    time.sleep(float(os.environ.get("FAKE_DRAIN_" + rid, "0")))
    note("exit")
    sys.exit(0)
ignore = os.environ.get("FAKE_IGNORE_" + rid)
signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore else on_term)
(out / f"{{rid}}.env").write_text(os.environ.get("OMPI_COMM_WORLD_RANK", ""))
(out / f"{{rid}}.pid").write_text(str(os.getpid()))
time.sleep(float(os.environ.get("FAKE_EXIT_AFTER_" + rid, "120")))
note("exit")
sys.exit(int(os.environ.get("FAKE_EXIT_CODE", "0")))
"""

# An mpirun stand-in: launches each MPMD segment, in its own process group as Open MPI does, and
# nothing more (no abort on a rank's exit), so the launcher's own rank supervision is what's tested.
FAKE_MPIRUN = f"""#!{PYTHON}
import subprocess, sys
args = sys.argv[sys.argv.index("-n"):] + [":"]
segments, current = [], []
for a in args:
    if a == ":":
        segments.append(current[2:])
        current = []
    else:
        current.append(a)
procs = [subprocess.Popen(s, process_group=0) for s in segments]
codes = [p.wait() for p in procs]
sys.exit(next((c for c in codes if c), 0))
"""


@dataclasses.dataclass
class Pod:
    dir: Path
    proc: subprocess.Popen[bytes]

    def wait_started(self, *ids: str) -> None:
        deadline = time.monotonic() + 20
        while not all((self.dir / f"{i}.pid").exists() for i in ids):
            assert self.proc.poll() is None, f"launcher exited {self.proc.returncode}"
            assert time.monotonic() < deadline, "ranks did not start"
            time.sleep(0.05)

    def at(self, rank: str, event: str) -> float:
        return float((self.dir / f"{rank}.{event}").read_text())

    def pid(self, rank: str) -> int:
        return int((self.dir / f"{rank}.pid").read_text())


def script(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/cmdline").read_bytes() != b""  # a zombie is not alive


@pytest.fixture
def pod(tmp_path: Path) -> Iterator[Callable[..., Pod]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(**env: str) -> Pod:
        (tmp_path / "cm").mkdir(exist_ok=True)
        full = {
            **os.environ,
            "FAKE_DIR": str(tmp_path),
            "LLMOP_TRITONSERVER": script(tmp_path / "tritonserver", FAKE_TRITON),
            "LLMOP_MPIRUN": script(tmp_path / "mpirun", FAKE_MPIRUN),
            "LLMOP_MODEL_REPO_SRC": str(tmp_path / "cm"),
            "LLMOP_MODEL_REPO": str(tmp_path / "repo"),
            "LLMOP_RUNTIME_DIR": str(tmp_path / "run"),
            "LLMOP_EXIT_TIMEOUT_SECONDS": "1",
            **env,
        }
        proc = subprocess.Popen([PYTHON, "-m", "llm_operator.runtime.launcher"], env=full)
        started.append(proc)
        return Pod(tmp_path, proc)

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


CPU = {"LLMOP_BACKEND": "cpu-reference"}
TP3 = {"LLMOP_TP": "3", "LLMOP_GPUS_PER_POD": "4"}


def test_cpu_server_gets_sigterm_and_a_clean_stop_exits_0(pod: Callable[..., Pod]) -> None:
    p = pod(**CPU)
    p.wait_started("rank0")
    p.proc.send_signal(signal.SIGTERM)
    assert p.proc.wait(timeout=20) == 0
    assert (p.dir / "rank0.term").exists()


INFO = json.dumps(up.XGRAMMAR_TOKENIZER_INFO_EXAMPLE)


@pytest.mark.parametrize(
    "info", [INFO, None, INFO[: len(INFO) // 2], "{}"], ids=["whole", "none", "torn", "{}"]
)
def test_an_engine_without_a_tokenizer_info_it_can_load_loads_without_a_guided_decoder(
    pod: Callable[..., Pod], tmp_path: Path, info: str | None
) -> None:
    """The operator's GPU repository turns xgrammar on over the file beside the engine; an engine
    built before the operator wrote it (or prebuilt without it, or with a torn one) would fail to
    load with it named, so the launcher empties both parameters before Triton starts."""
    from google.protobuf import text_format
    from llm_operator.modelrepo import render_repository, to_configmap_data
    from llm_operator.plan.types import PoolPlan
    from tritonclient.grpc import model_config_pb2

    engine, models, cm = tmp_path / "engine", tmp_path / "models", tmp_path / "cm"
    for d in (engine, cm, *(models / m / "1" for m in ("preprocessing", "postprocessing"))):
        d.mkdir(parents=True)
    (engine / "config.json").write_text('{"pretrained_config": {"mapping": {"tp_size": 1, "pp_size": 1}}}')
    (engine / "rank0.engine").write_text("")
    if info is not None:
        (engine / XGRAMMAR_TOKENIZER_INFO).write_text(info)
    for m in ("preprocessing", "postprocessing"):
        (models / m / "1" / "model.py").write_text("")
    spec = LLMDeploymentSpec.model_validate({"model": {"name": "m", "source": {"uri": "pvc://models/m"}},
                                             "engine": {"backend": "tensorrt-engine"}})  # fmt: skip
    pool = PoolPlan("main", "NVIDIA-H100-80GB-HBM3", ("NVIDIA-H100-80GB-HBM3",), (9, 0), 81559, 1, 1, 1, 1, 1)
    files = render_repository(spec, pool, engine_dir=str(engine), tokenizer_dir="")
    for key, text in to_configmap_data(files).items():
        (cm / key).write_text(text)
    p = pod(
        LLMOP_BACKEND="tensorrt-engine", LLMOP_ENGINE_DIR=str(engine), LLMOP_TRTLLM_MODELS_DIR=str(models)
    )
    p.wait_started("rank0")
    loaded = text_format.Parse((tmp_path / "repo" / "tensorrt_llm" / "config.pbtxt").read_text(),
                               model_config_pb2.ModelConfig())  # fmt: skip
    rendered = text_format.Parse(files["tensorrt_llm/config.pbtxt"], model_config_pb2.ModelConfig())
    guided = ("guided_decoding_backend", "xgrammar_tokenizer_info_path")
    assert tuple(rendered.parameters[k].string_value for k in guided) == (
        "xgrammar", str(engine / XGRAMMAR_TOKENIZER_INFO))  # fmt: skip
    if info != INFO:
        for k in guided:
            rendered.parameters[k].string_value = ""
    assert loaded == rendered  # nothing else of the model changed
    p.proc.send_signal(signal.SIGTERM)
    assert p.proc.wait(timeout=20) == 0


@pytest.mark.parametrize(("code", "expected"), [(3, 3), (0, EXIT_SERVER_GONE)])
def test_a_server_exiting_on_its_own_fails_the_pod(pod: Callable[..., Pod], code: int, expected: int) -> None:
    p = pod(**CPU, FAKE_EXIT_AFTER_rank0="0.2", FAKE_EXIT_CODE=str(code))
    assert p.proc.wait(timeout=20) == expected


def test_sigterm_reaches_rank0_first_and_the_others_once_it_has_drained(pod: Callable[..., Pod]) -> None:
    p = pod(**TP3, FAKE_DRAIN_rank0="1.0")
    p.wait_started("rank0", "rank1", "rank2")
    p.proc.send_signal(signal.SIGTERM)
    assert p.proc.wait(timeout=20) == 0
    assert p.at("rank0", "term") < p.at("rank0", "exit") <= p.at("rank1", "term")
    assert p.at("rank0", "exit") <= p.at("rank2", "term")


def test_a_rank_exiting_stops_its_siblings_and_fails_the_pod(pod: Callable[..., Pod]) -> None:
    p = pod(**TP3, FAKE_EXIT_AFTER_rank1="0.5")  # exits 0: still a lost rank
    p.wait_started("rank0", "rank1", "rank2")
    assert p.proc.wait(timeout=20) == EXIT_SERVER_GONE
    assert (p.dir / "rank0.term").exists() and (p.dir / "rank2.term").exists()
    assert not alive(p.pid("rank0")) and not alive(p.pid("rank2"))


def test_a_rank_ignoring_sigterm_is_killed_after_the_exit_timeout(pod: Callable[..., Pod]) -> None:
    p = pod(**TP3, FAKE_IGNORE_rank2="1")
    p.wait_started("rank0", "rank1", "rank2")
    start = time.monotonic()
    p.proc.send_signal(signal.SIGTERM)
    assert p.proc.wait(timeout=30) == 128 + signal.SIGKILL
    assert time.monotonic() - start < 1 + KILL_GRACE_SECONDS + 3
    assert not alive(p.pid("rank2"))


# What a leader's mpirun starts on a worker through its launch agent: an orted that leaves the
# session (daemonizes) and starts the worker's ranks.
FAKE_ORTED = f"""#!{PYTHON}
import subprocess, sys, os
server = os.environ["LLMOP_TRITONSERVER"]
ranks = [subprocess.Popen([server, f"--id=rank{{r}}"], process_group=0) for r in (2, 3)]
for r in ranks:
    r.wait()
"""


def test_a_worker_leaves_its_ranks_to_the_leader_on_sigterm(pod: Callable[..., Pod], tmp_path: Path) -> None:
    leader, worker = role_dirs(tmp_path / "identity")
    port = free_port()
    p = pod(LLMOP_ROLE="worker", LLMOP_TP="2", LLMOP_PP="2", LLMOP_GPUS_PER_POD="2",
            LLMOP_PODS_PER_REPLICA="2", LLMOP_LAUNCH_IDENTITY_DIR=str(worker), LLMOP_LAUNCH_PORT=str(port),
            LLMOP_EXIT_TIMEOUT_SECONDS="10")  # fmt: skip
    wait_listening(port)
    orted = script(tmp_path / "orted", FAKE_ORTED)
    assert launch(leader, port, f"setsid {orted} >/dev/null 2>&1 &").returncode == 0
    p.wait_started("rank2", "rank3")
    p.proc.send_signal(signal.SIGTERM)
    time.sleep(1)
    assert p.proc.poll() is None and not (p.dir / "rank2.term").exists(), "the leader stops worker ranks"
    assert "connection refused" in launch(leader, port, "true").stderr, "no new launch on a stopping pod"
    for rank in ("rank2", "rank3"):  # as the leader's mpirun would
        os.kill(p.pid(rank), signal.SIGTERM)
    assert p.proc.wait(timeout=5) == 0


# --- real Open MPI (where installed) ----------------------------------------------


@pytest.mark.skipif(not shutil.which("mpirun"), reason="Open MPI is not installed")
def test_real_mpirun_runs_the_mpmd_world_and_rank0_drains_first(pod: Callable[..., Pod]) -> None:
    p = pod(**TP3, LLMOP_MPIRUN=shutil.which("mpirun") or "", FAKE_DRAIN_rank0="1.0")
    p.wait_started("rank0", "rank1", "rank2")
    assert [(p.dir / f"rank{r}.env").read_text() for r in range(3)] == ["0", "1", "2"]  # MPI rank = --id
    p.proc.send_signal(signal.SIGTERM)
    assert p.proc.wait(timeout=20) == 0
    assert p.at("rank0", "exit") <= min(p.at("rank1", "term"), p.at("rank2", "term"))


@pytest.mark.skipif(not shutil.which("mpirun"), reason="Open MPI is not installed")
def test_real_mpirun_accepts_the_multi_node_options(tmp_path: Path) -> None:
    # 127.0.0.1 is a local address to Open MPI, so the "worker" needs no agent; the options still parse.
    fake = script(tmp_path / "tritonserver", FAKE_TRITON)
    mpirun = os.path.realpath(shutil.which("mpirun") or "")
    two_pods = {"LLMOP_TP": "2", "LLMOP_PP": "1", "LLMOP_GPUS_PER_POD": "1",
                "LLMOP_WORKER_HOST_PATTERN": "127.0.0.{worker}"}  # fmt: skip
    leader = config(**{**MULTI, **two_pods, "LLMOP_TRITONSERVER": fake, "LLMOP_MPIRUN": mpirun})
    env = {
        **os.environ,
        "FAKE_DIR": str(tmp_path),
        "FAKE_EXIT_AFTER_rank0": "0",
        "FAKE_EXIT_AFTER_rank1": "0",
    }
    result = subprocess.run(serve_command(leader), env=env, timeout=60,
                            capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "rank1.env").read_text() == "1"


# --- the real Triton CPU runtime ------------------------------------------------------------


@pytest.mark.triton
def test_launcher_serves_the_cpu_repository_drains_and_stops_cleanly(tmp_path: Path) -> None:
    import urllib.request

    import pytriton
    from llm_operator.modelrepo import render_repository, to_configmap_data
    from llm_operator.plan.cpu import cpu_plan

    triton = Path(pytriton.__file__).parent / "tritonserver"
    spec = LLMDeploymentSpec.model_validate({
        "model": {"name": "llm-operator/tiny-llama", "source": {"uri": "builtin://tiny-llama"}},
        "engine": {"backend": "cpu-reference", "maxBatchSize": 4, "maxInputLen": 64, "maxSeqLen": 128,
                   "maxNumTokens": 128, "cpuReference": {"contract": "tensorrt-engine"}},  # the ensemble
        "runtime": {"streaming": False},
    })  # fmt: skip
    cm = tmp_path / "configmap"
    cm.mkdir()
    # The python stub ignores PYTHONPATH: the model finds its imports through its own config.
    python_path = [str(Path(launcher.__file__).parents[2]), sysconfig.get_paths()["purelib"]]
    files = render_repository(
        spec, cpu_plan(spec).primary, engine_dir="", tokenizer_dir="", python_path=python_path
    )
    for key, text in to_configmap_data(files).items():
        (cm / key).write_text(text)
    backends = tmp_path / "backends"
    shutil.copytree(triton / "backends", backends)
    shutil.copy(triton / "python_backend_stubs" / "3.11" / "triton_python_backend_stub", backends / "python")
    http, grpc, metrics = free_port(), free_port(), free_port()
    env = {**os.environ, "LLMOP_BACKEND": "cpu-reference", "LLMOP_MODEL_REPO_SRC": str(cm),
           "LLMOP_MODEL_REPO": str(tmp_path / "repo"), "LLMOP_HTTP_PORT": str(http),
           "LLMOP_GRPC_PORT": str(grpc), "LLMOP_METRICS_PORT": str(metrics),
           "LLMOP_TRITONSERVER": str(triton / "bin" / "tritonserver"), "LLMOP_BACKEND_DIR": str(backends),
           "LLMOP_EXIT_TIMEOUT_SECONDS": "5", "LLMOP_DRAIN_SETTLE_SECONDS": "0", ADMIN_KEY_ENV: KEY,
           "LD_LIBRARY_PATH": str(triton.parents[1] / "nvidia_pytriton.libs")}  # fmt: skip
    log = (tmp_path / "launcher.log").open("w")
    proc = subprocess.Popen([PYTHON, "-m", "llm_operator.runtime.launcher"], env=env, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, (tmp_path / "launcher.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "launcher.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.3)
        admin_apis_answer_only_with_the_key(http, grpc)
        logged = (tmp_path / "launcher.log").read_text()
        assert "--http-restricted-api=" in logged and KEY not in logged
        start = time.monotonic()
        drained = subprocess.run(
            [PYTHON, "-m", "llm_operator.runtime.launcher", "drain"], env=env, timeout=30
        )
        assert drained.returncode == 0 and time.monotonic() - start < 10, "idle server: nothing to drain"
        table = processes.process_table()  # other tests' servers may be running: ours descend from proc
        server = [
            pid
            for pid in processes.descendants(table, proc.pid)
            if table[pid][1][:1] == [env["LLMOP_TRITONSERVER"]]
        ]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, (tmp_path / "launcher.log").read_text()[-3000:]
        assert server and not any(alive(pid) for pid in server)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def admin_apis_answer_only_with_the_key(http: int, grpc: int) -> None:
    """This Triton (the CPU runtime's) takes the restriction flags and enforces them on both
    protocols; the inference, metadata and model-config APIs stay open."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from e2e.generate import ADMIN_REQUESTS, answers, connection, open_requests

    def connect() -> http_client.HTTPConnection:
        return connection("127.0.0.1", http)

    assert answers(connect, ADMIN_REQUESTS) == dict.fromkeys(ADMIN_REQUESTS, 403)
    with_key = answers(connect, ADMIN_REQUESTS, {ADMIN_KEY_HEADER: KEY})
    assert with_key == {**dict.fromkeys(ADMIN_REQUESTS, 200), "model-repository (GET)": 405}, "POST only"
    assert answers(connect, ADMIN_REQUESTS, {ADMIN_KEY_HEADER: KEY[::-1]}) == dict.fromkeys(
        ADMIN_REQUESTS, 403
    )
    assert answers(connect, open_requests("ensemble")) == {"generate": 200, "model-config": 200}

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")
    try:
        with pytest.raises(InferenceServerException, match="restricted"):
            client.get_model_repository_index()
        with pytest.raises(InferenceServerException, match="restricted"):
            client.get_log_settings()
        metadata = {f"triton-grpc-protocol-{ADMIN_KEY_HEADER}": KEY}
        index = client.get_model_repository_index(headers=metadata, as_json=True)
        assert [m["name"] for m in index["models"]] == ["ensemble", "tensorrt_llm"]
        assert client.get_log_settings(headers=metadata, as_json=True)["settings"]
        assert client.is_server_ready() and client.get_model_metadata("ensemble").name == "ensemble"
    finally:
        client.close()
