"""engine.backend pytorch across the pods of a group: planned as pipeline stages across pods, one
mpirun of tp*pp ranks under trtllm-llmapi-launch, rank 0 supervised as the serving tritonserver.

The launcher's command is checked against upstream's launch contract (tests/upstream_names.py
LLMAPI_LAUNCH); a stand-in trtllm-llmapi-launch keeps that contract under real Open MPI where it
is installed. Only a GPU cluster shows the LLM API serving this way.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from llm_operator.contract import ENV
from llm_operator.desired import desired, plan_for
from llm_operator.plan.inventory import Inventory
from llm_operator.plan.types import PlanningError
from llm_operator.runtime.commands import across_pods, rank_args, serve_command
from llm_operator.runtime.config import ConfigError, PodConfig
from llm_operator.runtime.supervisor import EXIT_SERVER_GONE

from e2e.cluster.nodes import build_nodes, load_pools
from tests import upstream_names as up
from tests.unit import test_launcher
from tests.unit.launch_identities import free_port, launch, role_dirs, wait_listening
from tests.unit.model_cache_fixtures import cached
from tests.unit.test_launcher import Pod, alive, script
from tests.unit.test_pytorch_backend import never_built, pytorch
from tests.unit.test_render_rollout import IMAGES

PYTHON = sys.executable
pod = test_launcher.pod  # the launcher tests' fixture: a launcher process with fake servers
V1 = dataclasses.replace(IMAGES, trtllm_version="1.1.0")
MULTI = {"LLMOP_BACKEND": "pytorch", "LLMOP_TP": "8", "LLMOP_PP": "2", "LLMOP_GPUS_PER_POD": "8",
         "LLMOP_PODS_PER_REPLICA": "2", "LLMOP_GROUP_INDEX": "3",
         "LLMOP_WORKER_HOST_PATTERN": "m-g{group}-{worker}.m-pods.ns.svc",
         "LLMOP_MPIRUN": "/opt/hpcx/ompi/bin/mpirun"}  # fmt: skip


def config(**env: str) -> PodConfig:
    return PodConfig.from_env({"LLMOP_MODEL_REPO": "/repo", **MULTI, **env})


# --- operator: planning and rendering ---------------------------------------------------------


def test_a_replica_larger_than_a_node_runs_as_pipeline_stages_across_two_pods() -> None:
    ld = pytorch(parallelism={"tensor": 8, "pipeline": 2})
    (pool,) = plan_for(ld, None).pools
    assert (pool.tensor, pool.gpus_per_pod, pool.pods_per_replica) == (8, 8, 2)
    out = desired(ld, plan_for(ld, None), V1, never_built, models=cached)
    sets = {o["metadata"]["name"]: o for o in out.children if o["kind"] == "StatefulSet"}
    roles = {}
    for sts in sets.values():
        (container,) = sts["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        roles[env["LLMOP_ROLE"]] = env
        assert container["image"] == V1.runtime, "NVIDIA's image, as a single pod runs it"
        assert any(m["mountPath"] == "/checkpoint" for m in container["volumeMounts"]), "every rank reads it"
    assert set(roles) == {"leader", "worker"}
    assert {
        (r["LLMOP_BACKEND"], r["LLMOP_TP"], r["LLMOP_PP"], r["LLMOP_GPUS_PER_POD"]) for r in roles.values()
    } == {("pytorch", "8", "2", "8")}


def test_tensor_parallelism_across_pods_is_refused_naming_what_to_change() -> None:
    """GB200 trays of 4 GPUs in NVLink cliques: the planner spans TP over two pods of a clique,
    which the llmapi model does not support across nodes."""
    inventory = Inventory()
    for node in build_nodes(load_pools()):
        inventory.upsert(node)
    gb200 = {"gpu": {"products": ["NVIDIA-GB200"]}}
    engine = {
        **pytorch().spec.engine.model_dump(by_alias=True, exclude_none=True),
        "backend": "tensorrt-engine",
    }
    clique = plan_for(
        pytorch(parallelism={"tensor": 8, "pipeline": 1}, resources=gb200, engine=engine), inventory
    )
    assert (clique.pools[0].gpus_per_pod, clique.pools[0].pods_per_replica) == (4, 2), "engines may"
    with pytest.raises(PlanningError) as err:
        plan_for(pytorch(parallelism={"tensor": 8, "pipeline": 1}, resources=gb200), inventory)
    assert err.value.reason == "PyTorchTensorParallelAcrossPods"
    assert "tensor parallel 8" in err.value.message and "parallelism.pipeline" in err.value.message
    staged = plan_for(pytorch(parallelism={"tensor": 4, "pipeline": 2}, resources=gb200), inventory)
    assert (staged.pools[0].tensor, staged.pools[0].pods_per_replica) == (4, 2), "stages across pods may"


def test_tensor_parallel_domain_node_lets_auto_plan_pipeline_stages_for_pytorch() -> None:
    """A 70B model too large for one GB200 tray: under nvlink the planner's choice, TP over two
    trays of a clique, is refused for pytorch (pointing at the setting); under node it stages."""
    inventory = Inventory()
    for node in build_nodes(load_pools()):
        inventory.upsert(node)
    seventy_b = {"name": "meta-llama/Meta-Llama-3-70B-Instruct", "source": {"uri": "pvc://models/llama3-70b"}}
    engine = {**pytorch().spec.engine.model_dump(by_alias=True, exclude_none=True), "maxBatchSize": 256}
    auto = {"model": seventy_b, "engine": engine, "parallelism": {"tensor": "auto", "pipeline": "auto"},
            "resources": {"gpu": {"products": ["NVIDIA-GB200"]}}}  # fmt: skip
    with pytest.raises(PlanningError) as err:
        plan_for(pytorch(**auto), inventory)
    assert err.value.reason == "PyTorchTensorParallelAcrossPods"
    assert "placement.tensorParallelDomain node" in err.value.message
    (pool,) = plan_for(pytorch(**auto, placement={"tensorParallelDomain": "node"}), inventory).pools
    assert (pool.tensor, pool.pipeline, pool.gpus_per_pod, pool.pods_per_replica) == (4, 2, 4, 2)
    assert not pool.nvlink_clique


# --- launcher: the command line ---------------------------------------------------------------


def mca(cmd: list[str]) -> dict[str, str]:
    return {cmd[i + 1]: cmd[i + 2] for i, token in enumerate(cmd) if token == "--mca"}


def test_the_leader_runs_one_mpirun_of_tp_pp_ranks_each_under_trtllm_llmapi_launch() -> None:
    leader = config()
    cmd = serve_command(leader)
    assert cmd[0] == "/opt/hpcx/ompi/bin/mpirun" and ":" not in cmd, "one command for every rank"
    assert cmd[cmd.index("--host") + 1] == "localhost:8,m-g3-1.m-pods.ns.svc:8"
    assert cmd[cmd.index("--map-by") + 1] == "slot", "ranks 0-7 on the leader, 8-15 on the worker"
    launch = cmd.index(up.LLMAPI_LAUNCH)
    assert cmd[launch - 2 : launch] == ["-n", "16"]
    # Rank 0's tritonserver serves as today; the script runs the line on rank 0 only.
    assert cmd[launch + 1 :] == rank_args(leader, 0)
    assert "--http-port=8000" in cmd and "--id=rank0" in cmd and "--load-model=tensorrt_llm" not in cmd
    assert "--disable-auto-complete-config" not in cmd  # model.py applies triton_config
    # The same SSH identity, hosts and transport as the engine path.
    assert all(flag in cmd for flag in across_pods(leader))
    assert mca(cmd)["pml"] == "ob1" and mca(cmd)["plm_rsh_no_tree_spawn"] == "1"
    assert list(leader.local_ranks) == [0]
    assert list(config(LLMOP_ROLE="worker").local_ranks) == [], "a worker hosts no tritonserver"


def test_the_launch_script_and_its_environment_are_upstreams() -> None:
    """The default is the name the wheel installs; the script exports the proxy variables itself
    and takes rank and world size from Open MPI's (Slurm's, which would win, are no pod's), so
    the command sets none of them, and remote ranks take the worker pod's own environment."""
    assert ENV["LLMOP_LLMAPI_LAUNCH"] == up.LLMAPI_LAUNCH
    cmd = serve_command(config())
    names = (*up.LLMAPI_LAUNCH_SETS, *up.LLMAPI_LAUNCH_RANK, *up.LLMAPI_LAUNCH_WORLD)
    assert not [a for a in cmd if any(n in a for n in names)] and "-x" not in cmd
    assert "OMPI_COMM_WORLD_RANK" in up.LLMAPI_LAUNCH_RANK, "mpirun sets the rank the script reads"


def test_the_launch_script_is_resolved_to_one_absolute_path_for_every_pod(tmp_path: Path) -> None:
    from llm_operator.runtime.launcher import _resolve

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script(bin_dir / up.LLMAPI_LAUNCH, "#!/bin/sh\n")
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{old}"
    try:
        resolved = _resolve(config())
    finally:
        os.environ["PATH"] = old
    assert resolved.llmapi_launch == str(bin_dir / up.LLMAPI_LAUNCH)
    assert str(bin_dir / up.LLMAPI_LAUNCH) in serve_command(resolved)


def test_tensor_parallelism_wider_than_a_pod_is_refused_by_the_launcher_too() -> None:
    with pytest.raises(ConfigError, match="pipeline stages only"):
        config(LLMOP_TP="16", LLMOP_PP="1")


# --- supervision under a stand-in trtllm-llmapi-launch ----------------------------------------

# Keeps upstream's contract (tests/upstream_names.py LLMAPI_LAUNCH_*): the rank from
# OMPI_COMM_WORLD_RANK; rank 0 runs its arguments without the MPI variables beside a process that
# stays (upstream's MPI session server, its command line still naming --id=rank0), every other
# rank waits as an MPI worker until the world ends.
FAKE_LAUNCH = f"""#!{PYTHON}
import os, pathlib, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
out = pathlib.Path(os.environ["FAKE_DIR"])
(out / f"launch{{rank}}").write_text(os.environ.get("OMPI_COMM_WORLD_SIZE", ""))
if rank == "0":
    env = {{k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}}
    subprocess.call(sys.argv[1:], env=env)
else:
    (out / f"worker{{rank}}").write_text(str(os.getpid()))
time.sleep(120)  # rank 0: the MPI session server, which may outlive the tritonserver
"""


@pytest.fixture
def agent_port() -> Iterator[int]:
    """A listening port where the leader waits for its worker's launch agent."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def image(tmp_path: Path) -> dict[str, str]:
    """The files preflight wants of the serving image (the llmapi model)."""
    llmapi = tmp_path / "llmapi"
    (llmapi / "tensorrt_llm" / "1").mkdir(parents=True)
    for name in ("model.py", "helpers.py"):
        (llmapi / "tensorrt_llm" / "1" / name).write_text("# upstream's\n")
    return {"LLMOP_LLMAPI_MODELS_DIR": str(llmapi)}


def written(path: Path, timeout: float = 20) -> str:
    """What a rank wrote to path, once it has written it."""
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < deadline, f"{path.name} was not written"
        time.sleep(0.05)
    return path.read_text()


def two_pods(tmp_path: Path, port: int, mpirun: str) -> dict[str, Any]:
    return {**MULTI, "LLMOP_TP": "1", "LLMOP_PP": "2", "LLMOP_GPUS_PER_POD": "1", "LLMOP_ROLE": "leader",
            "LLMOP_WORKER_HOST_PATTERN": "127.0.0.{worker}", "LLMOP_LAUNCH_PORT": str(port),
            **image(tmp_path), "LLMOP_MPIRUN": mpirun,
            "LLMOP_LLMAPI_LAUNCH": script(tmp_path / "trtllm-llmapi-launch", FAKE_LAUNCH)}  # fmt: skip


@pytest.mark.skipif(not shutil.which("mpirun"), reason="Open MPI is not installed")
def test_under_real_mpirun_rank0_is_the_tritonserver_and_drains_before_the_workers_stop(
    pod: Any, tmp_path: Path, agent_port: int
) -> None:
    # 127.0.0.1 is local to Open MPI: the "worker" rank starts without the agent, the options parse.
    mpirun = os.path.realpath(shutil.which("mpirun") or "")
    p: Pod = pod(**two_pods(tmp_path, agent_port, mpirun), FAKE_DRAIN_rank0="1.0")
    p.wait_started("rank0")
    # Rank 1 starts beside rank 0, not before it: on a busy machine its files come later.
    assert written(tmp_path / "launch0") == written(tmp_path / "launch1") == "2"
    assert (tmp_path / "rank0.env").read_text() == "", "rank 0's tritonserver runs outside MPI"
    worker = int(written(tmp_path / "worker1"))
    p.proc.send_signal(signal.SIGTERM)
    assert p.proc.wait(timeout=30) == 0
    # SIGTERM reached the tritonserver itself (not mpirun or the wrapper naming --id=rank0).
    assert p.at("rank0", "term") < p.at("rank0", "exit")
    assert not alive(worker)


@pytest.mark.skipif(not shutil.which("mpirun"), reason="Open MPI is not installed")
def test_a_lost_tritonserver_fails_the_pod_though_its_wrapper_names_rank0(
    pod: Any, tmp_path: Path, agent_port: int
) -> None:
    mpirun = os.path.realpath(shutil.which("mpirun") or "")
    p: Pod = pod(**two_pods(tmp_path, agent_port, mpirun), FAKE_EXIT_AFTER_rank0="0.5")
    assert p.proc.wait(timeout=30) == EXIT_SERVER_GONE
    assert not alive(int(written(tmp_path / "worker1")))


@pytest.mark.skipif(not shutil.which("mpirun"), reason="Open MPI is not installed")
def test_a_lost_rank_is_named_by_mpiruns_report_in_the_termination_message(
    pod: Any, tmp_path: Path, agent_port: int
) -> None:
    """Rank 1 killed: real mpirun aborts the world (rank 0 first), the launcher lets it finish and
    the pod's last words say which rank died where (runtime/mpi_report.py), as the deployment's
    GroupRecreated Event then does."""
    mpirun = os.path.realpath(shutil.which("mpirun") or "")
    p: Pod = pod(
        **two_pods(tmp_path, agent_port, mpirun), LLMOP_TERMINATION_LOG=str(tmp_path / "termination-log")
    )
    os.kill(int(written(tmp_path / "worker1")), signal.SIGKILL)
    # Whichever the launcher sees first: rank 0 gone (1), or mpirun's own exit (137) with it.
    assert p.proc.wait(timeout=30) in (EXIT_SERVER_GONE, 128 + signal.SIGKILL)
    said = (tmp_path / "termination-log").read_text().splitlines()
    assert said[0] in ("rank0 exited: stopping the others", "the server exited (status 137)"), said
    assert re.fullmatch(r"mpirun: rank 1 on \S+ exited on signal 9 \(Killed\)", said[-1]), said


def test_worker_pods_stop_their_agent_and_wait_for_the_leaders_processes(pod: Any, tmp_path: Path) -> None:
    """A pytorch worker has no tritonserver: on SIGTERM it stops its launch agent at once (a worker
    on its way out takes no new launch) and waits for the leader's ranks it hosts (here: one started
    through its agent, leaving the session as orted does) rather than cutting them off."""
    leader, worker = role_dirs(tmp_path / "identity")
    port = free_port()
    p: Pod = pod(**{**MULTI, "LLMOP_TP": "1", "LLMOP_PP": "2", "LLMOP_GPUS_PER_POD": "1"},
                 LLMOP_ROLE="worker", **image(tmp_path), LLMOP_LAUNCH_IDENTITY_DIR=str(worker),
                 LLMOP_LAUNCH_PORT=str(port), LLMOP_EXIT_TIMEOUT_SECONDS="10")  # fmt: skip
    wait_listening(port)
    rank = 'sleep 120 & echo $! > "$FAKE_DIR/rank.pid"'
    assert launch(leader, port, f"setsid sh -c {shlex.quote(rank)} >/dev/null 2>&1 &").returncode == 0
    p.wait_started("rank")
    p.proc.send_signal(signal.SIGTERM)
    with pytest.raises(subprocess.TimeoutExpired):
        p.proc.wait(timeout=1)
    os.kill(p.pid("rank"), signal.SIGTERM)  # as the leader's mpirun would
    assert p.proc.wait(timeout=5) == 0
