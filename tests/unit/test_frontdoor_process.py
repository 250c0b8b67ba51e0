"""The front door as a process of the serving pod: the launcher starts it on leaders that name what
they serve and supervises it like Triton (its death ends the pod; on a stop it outlives Triton's
drain), it refuses a bad environment with exit 78, and it imports only what the serving images have.
Real processes: the launcher, the real front door, a tritonserver stand-in (test_launcher.py's)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from llm_operator.runtime.config import PodConfig
from llm_operator.runtime.cpu_reference import tokenizer_files
from llm_operator.runtime.launcher import frontdoor_command
from llm_operator.runtime.processes import descendants, process_table

from e2e.cluster.processes import free_ports
from tests.unit.test_dependencies import PACKAGE
from tests.unit.test_launcher import FAKE_TRITON, PYTHON, Pod, alive, script


def test_only_leaders_that_name_their_models_run_the_front_door() -> None:
    def cmd(**env: str) -> tuple[tuple[str, ...], ...]:
        return frontdoor_command(PodConfig.from_env({"LLMOP_MODEL_REPO": "/repo", **env}))

    assert cmd(LLMOP_SERVED_MODEL_NAMES="m,alias") == ((sys.executable, "-m", "llm_operator.frontdoor"),)
    assert cmd() == ()  # a pod the operator did not render for the OpenAI API
    worker = {"LLMOP_TP": "2", "LLMOP_GPUS_PER_POD": "1", "LLMOP_PODS_PER_REPLICA": "2",
              "LLMOP_ROLE": "worker",
              "LLMOP_SERVED_MODEL_NAMES": "m"}  # fmt: skip
    assert cmd(**worker) == ()


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[Callable[..., tuple[Pod, int]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(**env: str) -> tuple[Pod, int]:
        (tmp_path / "cm").mkdir(exist_ok=True)
        tokenizer_files.write(tmp_path / "tokenizer")
        http, api = free_ports(2)
        full = {**os.environ, "FAKE_DIR": str(tmp_path), "LLMOP_BACKEND": "cpu-reference",
                "LLMOP_GPUS_PER_POD": "0",
                "LLMOP_TRITONSERVER": script(tmp_path / "tritonserver", FAKE_TRITON),
                "LLMOP_MODEL_REPO_SRC": str(tmp_path / "cm"), "LLMOP_MODEL_REPO": str(tmp_path / "repo"),
                "LLMOP_EXIT_TIMEOUT_SECONDS": "3", "LLMOP_TOKENIZER_DIR": str(tmp_path / "tokenizer"),
                "LLMOP_SERVED_MODEL_NAMES": "m", "LLMOP_HTTP_PORT": str(http), "LLMOP_OPENAI_PORT": str(api),
                "LLMOP_TERMINATION_LOG": str(tmp_path / "termination-log"), **env}  # fmt: skip
        proc = subprocess.Popen([PYTHON, "-m", "llm_operator.runtime.launcher"], env=full)
        started.append(proc)
        pod = Pod(tmp_path, proc)
        pod.wait_started("rank0")
        deadline = time.monotonic() + 20
        while not answers(api):
            assert proc.poll() is None and time.monotonic() < deadline, "the front door did not answer"
            time.sleep(0.05)
        return pod, api

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def frontdoor_pid(launcher: int) -> int:
    table = process_table()
    return next(p for p in descendants(table, launcher) if "llm_operator.frontdoor" in table[p][1])


def test_a_front_door_that_dies_ends_the_pod(leader: Callable[..., tuple[Pod, int]]) -> None:
    pod, _ = leader()
    os.kill(frontdoor_pid(pod.proc.pid), signal.SIGKILL)
    assert pod.proc.wait(timeout=20) == 128 + signal.SIGKILL  # its own status, passed through
    assert (pod.dir / "rank0.term").exists()  # Triton was stopped with it
    assert "llm_operator.frontdoor exited (killed by signal 9)" in (pod.dir / "termination-log").read_text()


def test_a_stop_drains_triton_while_the_front_door_still_answers(
    leader: Callable[..., tuple[Pod, int]],
) -> None:
    pod, api = leader(FAKE_DRAIN_rank0="1.5")
    door = frontdoor_pid(pod.proc.pid)
    pod.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while not (pod.dir / "rank0.term").exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert answers(api) and alive(door)  # Triton is draining: streams in flight still get their tokens
    assert pod.proc.wait(timeout=20) == 0
    assert not alive(door)


@pytest.mark.parametrize(
    ("env", "names"),
    [({"LLMOP_SERVED_MODEL_NAMES": ""}, "LLMOP_SERVED_MODEL_NAMES"),
     ({"LLMOP_TOKENIZER_DIR": "/nonexistent"}, "/nonexistent/tokenizer.json"),
     ({"LLMOP_MAX_SEQ_LEN": "many"}, "LLMOP_MAX_SEQ_LEN"),
     ({"LLMOP_TOOL_CALL_PARSER": "qwen"}, "LLMOP_TOOL_CALL_PARSER='qwen' is not one of hermes, llama3-json")],
)  # fmt: skip
def test_a_bad_environment_is_refused_with_78_naming_it(
    env: dict[str, str], names: str, tmp_path: Path
) -> None:
    tokenizer_files.write(tmp_path)
    full = {**os.environ, "LLMOP_SERVED_MODEL_NAMES": "m", "LLMOP_TOKENIZER_DIR": str(tmp_path), **env}
    result = subprocess.run([PYTHON, "-m", "llm_operator.frontdoor"], env=full, capture_output=True,
                            text=True,
                            timeout=30)  # fmt: skip
    assert result.returncode == 78 and names in result.stderr, result.stderr


IMPORT_GUARD = """
import importlib, sys
FORBIDDEN = ("pydantic", "lightkube", "kopf", "yaml", "numpy", "torch", "transformers",
             "llm_operator.runtime", "llm_operator.api", "llm_operator.modelrepo")
class Guard:
    def find_spec(self, name, path=None, target=None):
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN):
            raise ImportError(f"the front door imported {name}")
sys.meta_path.insert(0, Guard())
for module in sys.argv[1:]:
    importlib.import_module(module)
"""


def test_the_front_door_imports_only_what_serving_images_carry() -> None:
    """Standard library, jinja2 and tokenizers (NVIDIA's images and the cpu-runtime image have
    them), h11 (shipped beside the injected package: tests/unit/test_inject.py), and of this
    package only the contract and itself."""
    modules = [f"llm_operator.frontdoor.{p.stem}" for p in sorted((PACKAGE / "frontdoor").glob("*.py"))]
    result = subprocess.run([sys.executable, "-c", IMPORT_GUARD, *modules], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "llm_operator.frontdoor.server" in modules
