"""The cpu-reference model split over two ranks of one mpirun, launched in the pytorch backend's
shape (runtime/commands.py serve_command: `mpirun -n WORLD <the LLM API's launcher> tritonserver`):
rank 0 serves the operator-rendered llmapi repository from a real tritonserver, rank 1 is the second
pipeline stage (runtime/cpu_reference/launch.py), and the answers are the whole model's, token for
token. Between pods the same line adds SSH to the workers (commands.across_pods)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from llm_operator.runtime.cpu_reference.launch import script
from llm_operator.runtime.cpu_reference.pipeline import PORT_ENV

from e2e.cluster.processes import free_port
from tests.triton.conftest import expected, serve
from tests.triton.server import TritonProcess
from tests.triton.test_cpu_llmapi import generate, llmapi_spec, stream

pytestmark = pytest.mark.triton

OPERATOR = Path(__file__).resolve().parents[2] / "operator"


@pytest.fixture(scope="module")
def split_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonProcess]:
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("Open MPI's mpirun is not installed")
    work = tmp_path_factory.mktemp("triton-pipeline")
    # The image's launcher program, on this interpreter and checkout.
    launcher = work / "llm-operator-cpu-llmapi-launch"
    launcher.write_text(script(sys.executable, str(OPERATOR)))
    launcher.chmod(0o755)
    launch = [mpirun, "--allow-run-as-root", "--bind-to", "none", "--map-by", "slot", "--host", "localhost:2",
              "-n", "2", str(launcher)]  # fmt: skip
    env = {"PYTHONPATH": str(OPERATOR), "LLMOP_LEADER_HOST": "127.0.0.1", PORT_ENV: str(free_port())}
    yield from serve(work, llmapi_spec(), env=env, launch=launch)


def test_two_ranks_answer_what_the_whole_model_answers(split_server: TritonProcess) -> None:
    for prompt, tokens in (("Hello", 12), ("a longer prompt, padded in no batch", 30)):
        assert generate(split_server, prompt, tokens)["text_output"] == expected(prompt, tokens)
    assert stream(split_server, "Hello", 12)[-1]["text_output"] == expected("Hello", 12)
    log = split_server.log_tail(100_000)
    assert "pipeline stage 1 of 2: layers range(1, 2)" in log, "rank 1 runs the second layer"
