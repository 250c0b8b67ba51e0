"""The launcher's last words: a server that cannot start leaves its error lines in the pod's
termination message (Kubernetes shows it in lastState.terminated.message, the operator in the
LLMDeployment's status), while its whole output still reaches the container log."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from llm_operator.runtime.supervisor import error_line

# A tritonserver that fails to load its model, in Triton's words and log format.
FAILING_TRITON = f"""#!{sys.executable}
import sys
err = sys.stderr
print("I1123 17:25:57.704034 7 model_lifecycle.cc:472] \\"loading: ensemble:1\\"", file=err)
print("E1123 17:25:57.704035 7 server.cc:241] \\"CudaDriverHelper has not been initialized.\\"", file=err)
print("| ensemble | 1 | UNAVAILABLE: Internal: Unable to initialize shared memory |")
print("E1123 17:25:57.725271 7 model_lifecycle.cc:642] \\"failed to load 'ensemble' version 1: "
      "Internal: Unable to initialize shared memory. Error: No space left on device\\"", file=err)
print("error: creating server: Internal - failed to load all models", file=err)
sys.exit(1)
"""


def test_error_lines_of_triton_and_glog() -> None:
    assert error_line('E1123 17:25:57.725271 7 model_lifecycle.cc:642] "failed to load"') == "failed to load"
    assert error_line("E0101 00:00:00.000001   12 x.cc:1] no quotes") == "no quotes"
    assert error_line("error: creating server: x") == "error: creating server: x"
    assert error_line('I1123 17:25:57.704034 7 server.cc:1] "loaded"') is None
    assert error_line("| ensemble | 1 | UNAVAILABLE |") is None


def test_a_server_that_fails_to_load_leaves_its_errors_as_the_termination_message(tmp_path: Path) -> None:
    server = tmp_path / "tritonserver"
    server.write_text(FAILING_TRITON)
    server.chmod(0o755)
    (tmp_path / "cm").mkdir()
    message = tmp_path / "termination-log"
    env = {**os.environ, "LLMOP_BACKEND": "cpu-reference", "LLMOP_TRITONSERVER": str(server),
           "LLMOP_MODEL_REPO_SRC": str(tmp_path / "cm"), "LLMOP_MODEL_REPO": str(tmp_path / "repo"),
           "LLMOP_TERMINATION_LOG": str(message)}  # fmt: skip
    run = subprocess.run([sys.executable, "-m", "llm_operator.runtime.launcher"], env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 1, run.stderr
    assert message.read_text().splitlines() == [
        "the server exited (status 1)",
        "CudaDriverHelper has not been initialized.",
        "failed to load 'ensemble' version 1: Internal: Unable to initialize shared memory. "
        "Error: No space left on device",
        "error: creating server: Internal - failed to load all models",
    ]
    # Everything the server wrote still reaches the container log, in order.
    assert "| ensemble | 1 | UNAVAILABLE" in run.stderr
    assert run.stderr.index("loading: ensemble") < run.stderr.index("error: creating server")


@pytest.mark.parametrize("env", [{"LLMOP_TP": "two"}])
def test_a_refused_configuration_is_the_termination_message(tmp_path: Path, env: dict[str, str]) -> None:
    message = tmp_path / "termination-log"
    run = subprocess.run([sys.executable, "-m", "llm_operator.runtime.launcher"],
                         env={**os.environ, **env, "LLMOP_TERMINATION_LOG": str(message)},
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 78
    assert message.read_text() == "LLMOP_TP='two' is not an integer"
