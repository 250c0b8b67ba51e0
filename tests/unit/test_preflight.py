"""The launcher's preflight: before Triton starts, the first missing file the repository loads (a
pre/postprocessing model.py, the engine's config.json or a rank file, the tokenizer) is named in
one line, on stderr and as the termination message, and the launcher exits 78."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from llm_operator.runtime.config import PodConfig
from llm_operator.runtime.cpu_reference import checkpoint, gguf_files
from llm_operator.runtime.launcher import EXIT_CONFIG
from llm_operator.runtime.preflight import (
    CPU_REFERENCE_CHECKPOINT_FILES,
    CPU_REFERENCE_MODEL_TYPE,
    CPU_REFERENCE_PACKAGED_WEIGHTS,
    TOKENIZER_FILES,
    first_missing,
)


@pytest.fixture
def pod(tmp_path: Path) -> dict[str, str]:
    """A complete tp=2 engine pod: its ConfigMap names pre/postprocessing, the image has their
    model.py, the engine has config.json and both ranks, the tokenizer has tokenizer.json."""
    cm, models, engine, tokenizer = (tmp_path / d for d in ("cm", "models", "engine", "tokenizer"))
    for d in (cm, engine, tokenizer):
        d.mkdir()
    for model in ("preprocessing", "postprocessing", "tensorrt_llm", "ensemble"):
        (cm / f"{model}__config.pbtxt").write_text(f'name: "{model}"')
    for model in ("preprocessing", "postprocessing"):
        (models / model / "1").mkdir(parents=True)
        (models / model / "1" / "model.py").write_text("class TritonPythonModel: ...")
    (engine / "config.json").write_text('{"pretrained_config": {"mapping": {"tp_size": 2, "pp_size": 1}}}')
    for rank in (0, 1):
        (engine / f"rank{rank}.engine").write_bytes(b"")
    (tokenizer / "tokenizer.json").write_text("{}")
    return {"LLMOP_TP": "2", "LLMOP_GPUS_PER_POD": "2", "LLMOP_MODEL_REPO_SRC": str(cm),
            "LLMOP_MODEL_REPO": str(tmp_path / "repo"), "LLMOP_TRTLLM_MODELS_DIR": str(models),
            "LLMOP_ENGINE_DIR": str(engine), "LLMOP_TOKENIZER_DIR": str(tokenizer)}  # fmt: skip


def missing(env: dict[str, str]) -> str | None:
    return first_missing(PodConfig.from_env(env))


def test_a_complete_pod_passes(pod: dict[str, str]) -> None:
    assert missing(pod) is None


@pytest.mark.parametrize(
    ("remove", "named"),
    [("models/preprocessing/1/model.py", "models/preprocessing/1/model.py not found"),
     ("models/postprocessing/1/model.py", "models/postprocessing/1/model.py not found"),
     ("engine/config.json", "engine/config.json not found"),
     ("engine/rank0.engine", "engine/rank0.engine not found"),
     ("engine/rank1.engine", "engine/rank1.engine not found: tp*pp = 2 ranks, one engine each"),
     ("tokenizer/tokenizer.json", "tokenizer/tokenizer.json not found (nor tokenizer.model, vocab.json, "
                                  "vocab.txt)")],
)  # fmt: skip
def test_the_missing_file_is_named(pod: dict[str, str], tmp_path: Path, remove: str, named: str) -> None:
    (tmp_path / remove).unlink()
    said = missing(pod)
    assert said is not None and said.startswith(f"{tmp_path}/{named}"), said
    assert "\n" not in said


def test_a_model_the_repository_does_not_hold_needs_no_model_py(pod: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "models/postprocessing/1/model.py").unlink()
    (tmp_path / "cm/postprocessing__config.pbtxt").unlink()
    assert missing(pod) is None


@pytest.mark.parametrize("name", TOKENIZER_FILES)
def test_any_tokenizer_autotokenizer_loads_passes(pod: dict[str, str], tmp_path: Path, name: str) -> None:
    (tmp_path / "tokenizer/tokenizer.json").unlink()
    (tmp_path / "tokenizer" / name).write_text("x")
    assert missing(pod) is None


def test_an_absent_tokenizer_directory_is_named(pod: dict[str, str], tmp_path: Path) -> None:
    said = missing({**pod, "LLMOP_TOKENIZER_DIR": str(tmp_path / "nowhere")})
    assert said is not None and said.startswith(f"{tmp_path}/nowhere/tokenizer.json not found")


def test_the_cpu_reference_backend_checks_only_a_tokenizer_it_is_given(tmp_path: Path) -> None:
    (tmp_path / "cm").mkdir()
    cpu = {"LLMOP_BACKEND": "cpu-reference", "LLMOP_MODEL_REPO_SRC": str(tmp_path / "cm")}
    assert missing(cpu) is None
    said = missing({**cpu, "LLMOP_TOKENIZER_DIR": str(tmp_path / "tok")})
    assert said is not None and said.startswith(f"{tmp_path}/tok/tokenizer.json not found")


@pytest.mark.parametrize("remove", ["tokenizer/tokenizer.json", "engine/rank1.engine",
                                    "models/preprocessing/1/model.py"])  # fmt: skip
def test_the_launcher_exits_78_with_the_line_as_its_termination_message(
    pod: dict[str, str], tmp_path: Path, remove: str
) -> None:
    (tmp_path / remove).unlink()
    message = tmp_path / "termination-log"
    run = subprocess.run(
        [sys.executable, "-m", "llm_operator.runtime.launcher"],
        env={**os.environ, **pod, "LLMOP_TERMINATION_LOG": str(message),
             "LLMOP_TRITONSERVER": str(tmp_path / "no-tritonserver")},  # never reached
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == EXIT_CONFIG == 78, run.stderr
    line = message.read_text()
    assert line.startswith(f"{tmp_path}/{remove} not found") and "\n" not in line, line
    assert line in run.stderr
    assert not (tmp_path / "repo").exists(), "nothing is materialized before the checks pass"


@pytest.fixture
def cpu_checkpoint(tmp_path: Path) -> dict[str, str]:
    """A cpu-reference pod serving a cached checkpoint, which is also its tokenizer directory."""
    (tmp_path / "cm").mkdir()
    checkpoint.write(tmp_path / "model", seed=0)
    model = str(tmp_path / "model")
    return {"LLMOP_BACKEND": "cpu-reference", "LLMOP_GPUS_PER_POD": "0", "LLMOP_MODEL_DIR": model,
            "LLMOP_TOKENIZER_DIR": model, "LLMOP_MODEL_REPO_SRC": str(tmp_path / "cm")}  # fmt: skip


def test_a_cpu_reference_checkpoint_passes_and_its_missing_files_are_named(
    cpu_checkpoint: dict[str, str], tmp_path: Path
) -> None:
    assert missing(cpu_checkpoint) is None
    for name in CPU_REFERENCE_CHECKPOINT_FILES:
        kept = (tmp_path / "model" / name).read_bytes()
        (tmp_path / "model" / name).unlink()
        said = missing(cpu_checkpoint)
        assert said is not None and said.startswith(f"{tmp_path}/model/{name} not found"), said
        (tmp_path / "model" / name).write_bytes(kept)


def test_a_checkpoint_of_another_model_is_refused_before_triton_starts(
    cpu_checkpoint: dict[str, str], tmp_path: Path
) -> None:
    """A real Llama cached for a cpu-reference deployment: one line naming config.json and the fix."""
    (tmp_path / "model/config.json").write_text('{"model_type": "llama", "hidden_size": 4096}')
    said = missing(cpu_checkpoint)
    assert said == (
        f'{tmp_path}/model/config.json: model_type is not "llm-operator-tiny": the cpu-reference backend '
        "serves only its own tiny checkpoints; serve this model with the tensorrt-engine or pytorch backend"
    )
    assert checkpoint.MODEL_TYPE == CPU_REFERENCE_MODEL_TYPE
    assert tuple(CPU_REFERENCE_CHECKPOINT_FILES) == (checkpoint.CONFIG_FILE, checkpoint.WEIGHTS_FILE)
    assert CPU_REFERENCE_PACKAGED_WEIGHTS == gguf_files.WEIGHTS_FILE
