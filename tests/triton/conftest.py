"""Real tritonservers (nvidia-pytriton wheel) serving the operator-rendered CPU repository, reached
the way a pod reaches it: render_repository -> ConfigMap data -> materialize -> tritonserver.

A failing test gets the tail of its servers' logs in its report.
"""

from __future__ import annotations

import sysconfig
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.modelrepo import render_repository, to_configmap_data, weights_seed
from llm_operator.plan.cpu import cpu_plan
from llm_operator.plan.types import PoolPlan
from llm_operator.runtime.cpu_reference import TINY_MODELS
from llm_operator.runtime.cpu_reference.tiny_lm import Sampler, TinyLM
from llm_operator.runtime.repository import materialize

from tests.triton.server import TritonProcess

REPO = Path(__file__).resolve().parents[2]
SERVERS = ("streaming_server", "batch_server")


def cpu_spec(streaming: bool) -> LLMDeploymentSpec:
    return LLMDeploymentSpec.model_validate(
        {
            "model": {"name": "llm-operator/tiny-llama", "source": {"uri": "builtin://tiny-llama"}},
            # The ensemble: test_cpu_llmapi.py's llmapi_spec names the default, pytorch, over it.
            "engine": {"backend": "cpu-reference", "maxBatchSize": 8, "maxInputLen": 64, "maxSeqLen": 256,
                       "maxNumTokens": 256, "cpuReference": {"contract": "tensorrt-engine"}},
            # 20 ms lets concurrent requests meet in one batch even on a busy 2-core machine.
            "runtime": {"streaming": streaming, "batching": {"maxQueueDelayMicroseconds": 20000}},
        }
    )  # fmt: skip


def expected(prompt: str, max_tokens: int, sampler: Sampler | None = None) -> str:
    """What the server must answer: the same model run alone, in this process."""
    lm = TinyLM(TINY_MODELS["tiny-llama"], weights_seed(cpu_spec(True).model.revision or "main"))
    return "".join(lm.generate(prompt, max_tokens, sampler))


def serve(
    workdir: Path,
    spec: LLMDeploymentSpec,
    env: dict[str, str] | None = None,
    pool: PoolPlan | None = None,
    launch: list[str] | None = None,
) -> Generator[TritonProcess, None, None]:
    """pool: the plan's, when the spec's own cannot be planned here (a cached model's); launch:
    what starts tritonserver (an mpirun line)."""
    # The stub must import torch, numpy and this checkout's llm_operator from the test environment.
    python_path = (str(REPO / "operator"), sysconfig.get_paths()["purelib"])
    pool = pool or cpu_plan(spec).primary
    files = render_repository(spec, pool, engine_dir="", tokenizer_dir="", python_path=python_path)
    configmap = workdir / "configmap"  # what kubelet mounts: one file per key
    configmap.mkdir()
    for key, text in to_configmap_data(files).items():
        (configmap / key).write_text(text)
    materialize(configmap, workdir / "repo")
    server = TritonProcess(repo=workdir / "repo", workdir=workdir, env=env or {}, launch=launch or [])
    try:
        server.start()
    except RuntimeError as e:
        pytest.fail(str(e))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def streaming_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonProcess]:
    yield from serve(tmp_path_factory.mktemp("triton-streaming"), cpu_spec(streaming=True))


@pytest.fixture(scope="session")
def batch_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonProcess]:
    yield from serve(tmp_path_factory.mktemp("triton-batch"), cpu_spec(streaming=False))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and isinstance(item, pytest.Function):
        for name in SERVERS:
            server = item.funcargs.get(name)
            if isinstance(server, TritonProcess):
                report.sections.append((f"{name} log (tail)", server.log_tail()))
    return report
