"""The cpu-reference model split over two processes (pipeline.py, launch.py): rank 1 is a real
process started as mpirun starts a rank (Open MPI's variables, the launch module), rank 0 is this
test's, and the split model answers token for token what the whole model answers in one process.
And the launcher's side: a cpu-reference group's mpirun line and what its config refuses."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.plan.cpu import cpu_plan
from llm_operator.plan.types import PlanningError
from llm_operator.runtime.commands import rank_args, serve_command
from llm_operator.runtime.config import ConfigError, PodConfig
from llm_operator.runtime.cpu_reference import TINY_MODELS, pipeline
from llm_operator.runtime.cpu_reference.launch import mpi_rank, mpi_world_size, server_environment
from llm_operator.runtime.cpu_reference.tiny_lm import Decoder, Sampler, TinyLM

from e2e.cluster.processes import free_port

OPERATOR = Path(__file__).resolve().parents[2] / "operator"
SEED = 7
PROMPTS = ["Hello", "a much longer prompt than the first one", "x"]
TOKENS = 12


def decode(lm: Decoder, prompts: list[str], samplers: list[Sampler]) -> list[list[int]]:
    """Lockstep decoding of one batch, as decoding.steps drives it."""
    batch = lm.start([list(p.encode()) for p in prompts])
    out: list[list[int]] = [[] for _ in prompts]
    for step in range(TOKENS):
        tokens = batch.pick(samplers)
        for row, token in zip(out, tokens, strict=True):
            row.append(token)
        if step + 1 < TOKENS:
            batch.advance(tokens)
    return out


def samplers() -> list[Sampler]:
    return [Sampler(), Sampler(top_k=20, temperature=0.8, seed=3), Sampler()]


class Stage:
    def __init__(self, port: int, world: int, rank: int) -> None:
        env = {**os.environ, "PYTHONPATH": str(OPERATOR), "OMPI_COMM_WORLD_RANK": str(rank),
               "OMPI_COMM_WORLD_SIZE": str(world), "LLMOP_LEADER_HOST": "127.0.0.1",
               pipeline.PORT_ENV: str(port)}  # fmt: skip
        argv = [sys.executable, "-m", "llm_operator.runtime.cpu_reference.launch", "false"]
        self.process = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)

        self.log = ""

    def finish(self) -> int:
        try:
            _, self.log = self.process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, self.log = self.process.communicate()
        return self.process.returncode


def split(identity: dict[str, object], world: int = 2) -> Iterator[tuple[Decoder, list[Stage]]]:
    port = free_port()
    stages = [Stage(port, world, rank) for rank in range(1, world)]
    whole = TinyLM(TINY_MODELS["tiny-llama"], SEED)
    lm = pipeline.lead(whole, world, identity, {pipeline.PORT_ENV: str(port)})
    assert isinstance(lm, pipeline.LeaderDecoder)
    try:
        yield lm, stages
    finally:
        lm.link.stop()
    for stage in stages:
        assert stage.finish() == 0, stage.log


@pytest.fixture(scope="module")
def whole() -> list[list[int]]:
    return decode(TinyLM(TINY_MODELS["tiny-llama"], SEED), PROMPTS, samplers())


def test_two_stages_answer_token_for_token_what_the_whole_model_answers(whole: list[list[int]]) -> None:
    for lm, stages in split({"model": "tiny-llama", "weights_seed": SEED, "model_dir": ""}):  # noqa: B007 (read after it)
        assert decode(lm, PROMPTS, samplers()) == whole
        # A second batch after the first: the stages start over with it.
        assert decode(lm, PROMPTS[:1], samplers()[:1]) == whole[:1]
    assert "pipeline stage 1 of 2: layers range(1, 2)" in stages[0].log


def test_the_second_stage_computes_its_layers_from_its_own_weights(whole: list[list[int]]) -> None:
    """Rank 0 holds seed SEED's weights; told to load another seed, rank 1 changes the answer:
    layer 1 really runs there, not on rank 0."""
    for lm, _ in split({"model": "tiny-llama", "weights_seed": SEED + 1, "model_dir": ""}):
        assert decode(lm, PROMPTS, samplers()) != whole


def test_layers_split_into_consecutive_stages_covering_the_model() -> None:
    assert [pipeline.stage_layers(5, r, 3) for r in range(3)] == [range(0, 2), range(2, 4), range(4, 5)]
    assert [pipeline.stage_layers(2, r, 2) for r in range(2)] == [range(0, 1), range(1, 2)]
    with pytest.raises(ValueError, match="2 layers cannot be split into 3 pipeline stages"):
        pipeline.stage_layers(2, 0, 3)


def test_rank_and_world_come_from_the_launchers_variables_as_upstream_reads_them() -> None:
    ompi = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "PMIX_RANK": "1", "PATH": "/bin"}
    assert (mpi_rank(ompi), mpi_world_size(ompi)) == (1, 2)
    assert (mpi_rank({"SLURM_PROCID": "3", "OMPI_COMM_WORLD_RANK": "1"}), mpi_world_size({})) == (3, 1)
    # Rank 0's server: no MPI variables of its own, the world's size under the pipeline's name.
    assert server_environment({**ompi, "OMPI_COMM_WORLD_RANK": "0"}) == {
        "PATH": "/bin",
        pipeline.WORLD_ENV: "2",
    }


CPU_GROUP = {"LLMOP_BACKEND": "cpu-reference", "LLMOP_CONTRACT": "pytorch", "LLMOP_TP": "1", "LLMOP_PP": "2",
             "LLMOP_GPUS_PER_POD": "0", "LLMOP_PODS_PER_REPLICA": "2",
             "LLMOP_WORKER_HOST_PATTERN": "d-g{group}-{worker}.d-pods.ns.svc",
             "LLMOP_LLMAPI_LAUNCH": "/usr/local/bin/llm-operator-cpu-llmapi-launch"}  # fmt: skip


def test_a_cpu_group_launches_one_stage_per_pod_as_the_pytorch_backend_launches_its_ranks() -> None:
    c = PodConfig.from_env(CPU_GROUP)
    argv = serve_command(c)
    hosts = argv[argv.index("--host") + 1]
    assert hosts == "localhost:1,d-g0-1.d-pods.ns.svc:1", "one rank on the leader, one on its worker"
    launch = argv.index(c.llmapi_launch)
    assert argv[launch - 2 : launch] == ["-n", "2"] and argv[launch + 1 :] == rank_args(c, 0)
    assert "plm_rsh_agent" in argv, "ranks reach the worker through its launch agent"
    assert list(c.local_ranks) == [0], "rank 0's tritonserver is the leader's only Triton rank"
    worker = PodConfig.from_env({**CPU_GROUP, "LLMOP_ROLE": "worker"})
    assert list(worker.local_ranks) == []


@pytest.mark.parametrize(
    "change",
    [{"LLMOP_CONTRACT": ""}, {"LLMOP_TP": "2", "LLMOP_PP": "1"}, {"LLMOP_PP": "3"}],
    ids=["ensemble-contract", "tensor-across-pods", "stages-not-pods"],
)
def test_a_cpu_group_other_than_one_stage_per_pod_on_the_llmapi_contract_is_refused(
    change: dict[str, str],
) -> None:
    with pytest.raises(ConfigError, match="one per pod, on the LLM API contract"):
        PodConfig.from_env({**CPU_GROUP, **change})


def cpu_spec(pipeline: int) -> LLMDeploymentSpec:
    return LLMDeploymentSpec.model_validate(
        {"model": {"name": "tiny", "source": {"uri": "builtin://tiny-llama"}},
         "engine": {"backend": "cpu-reference", "cpuReference": {"contract": "pytorch"}},
         "parallelism": {"tensor": 1, "pipeline": pipeline}}
    )  # fmt: skip


def test_the_planner_gives_each_pipeline_stage_a_cpu_pod_of_the_group() -> None:
    pool = cpu_plan(cpu_spec(2)).primary
    assert (pool.pipeline, pool.pods_per_replica, pool.gpus_per_pod) == (2, 2, 0)
    with pytest.raises(PlanningError, match=r"has 2 layers: parallelism\.pipeline must be at most 2"):
        cpu_plan(cpu_spec(4))
