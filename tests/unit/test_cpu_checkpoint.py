"""The cpu-reference checkpoint format (runtime/cpu_reference/checkpoint.py): seed N's directory
holds exactly builtin://tiny-llama's weights with weights_seed N, is a tokenizer directory the front
door loads, and a directory that is not one is refused with one line naming the file and the key."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from llm_operator.frontdoor.tokenizer import Tokenizer
from llm_operator.runtime.cpu_reference import TINY_MODELS
from llm_operator.runtime.cpu_reference.checkpoint import CheckpointError, load, write
from llm_operator.runtime.cpu_reference.tiny_lm import TinyLM, seeded_tensors
from safetensors.torch import load_file, save_file

TINY = TINY_MODELS["tiny-llama"]
PROMPT = "The model cache"


def text(lm: TinyLM) -> str:
    return "".join(lm.generate(PROMPT, 24))


@pytest.fixture(scope="module")
def seed0(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("seed0")
    write(directory, seed=0)
    return directory


def test_seed_0_holds_the_builtin_weights_and_serves_the_builtin_text(seed0: Path) -> None:
    assert sorted(p.name for p in seed0.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    # Readable by other uids (a serving pod's is not the writer's).
    assert all(p.stat().st_mode & 0o004 for p in seed0.iterdir()), {
        p.name: oct(p.stat().st_mode) for p in seed0.iterdir()
    }
    stored, builtin = load_file(str(seed0 / "model.safetensors")), seeded_tensors(TINY, 0)
    assert stored.keys() == builtin.keys()
    assert all(stored[name].dtype == torch.float64 for name in stored)
    assert all(torch.equal(stored[name], builtin[name]) for name in builtin)
    assert text(load(seed0)) == text(TinyLM(TINY, 0))
    config = json.loads((seed0 / "config.json").read_text())
    assert config == {
        "model_type": "llm-operator-tiny",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 256,
        "max_position_embeddings": 512,
        "torch_dtype": "float64",
    }


def test_another_seed_is_another_model(tmp_path: Path, seed0: Path) -> None:
    """The CLI the test world runs; seed 1 must differ in text, or a revision change proves nothing."""
    subprocess.run(
        [sys.executable, "-m", "llm_operator.runtime.cpu_reference.checkpoint", str(tmp_path), "--seed", "1"],
        check=True,
    )
    assert text(load(tmp_path)) == text(TinyLM(TINY, 1)) != text(load(seed0))


def test_the_checkpoint_is_the_tokenizer_directory(seed0: Path) -> None:
    tokenizer = Tokenizer.load(seed0)
    assert tokenizer.encode(PROMPT) == list(PROMPT.encode())
    assert tokenizer.chat_template is not None


def copy_of(seed0: Path, tmp_path: Path) -> Path:
    for p in seed0.iterdir():
        (tmp_path / p.name).write_bytes(p.read_bytes())
    return tmp_path


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda d: (d / "config.json").unlink(),
            r"/config\.json not found: a cpu-reference checkpoint holds",
        ),
        (lambda d: (d / "model.safetensors").unlink(), r"/model\.safetensors not found"),
        (lambda d: (d / "config.json").write_text("{"), r"/config\.json is not readable JSON"),
        (
            lambda d: (d / "config.json").write_text('{"model_type": "llama"}'),
            r'model_type is not "llm-operator-tiny"',
        ),
        (
            lambda d: (d / "config.json").write_text('{"model_type": "llm-operator-tiny"}'),
            r"/config\.json has no 'num_hidden_layers'$",
        ),
        (lambda d: (d / "model.safetensors").write_bytes(b"not safetensors"), r"is not a safetensors file"),
        (
            lambda d: save_file(
                {"embed": torch.zeros(256, 64, dtype=torch.float64)}, str(d / "model.safetensors")
            ),
            r"/model\.safetensors: tensor layers\.0\.q is missing",
        ),
        (
            lambda d: save_file(
                {**seeded_tensors(TINY, 0), "lm_head": torch.zeros(64, 255, dtype=torch.float64)},
                str(d / "model.safetensors"),
            ),
            r"tensor lm_head has shape \[64, 255\], the config needs \[64, 256\]",
        ),
    ],
    ids=[
        "no-config",
        "no-weights",
        "bad-json",
        "other-model-type",
        "missing-key",
        "not-safetensors",
        "missing-tensor",
        "wrong-shape",
    ],
)
def test_a_directory_that_is_not_a_checkpoint_is_refused_in_one_line(
    seed0: Path, tmp_path: Path, damage: Callable[[Path], object], message: str
) -> None:
    directory = copy_of(seed0, tmp_path)
    damage(directory)
    with pytest.raises(CheckpointError, match=message) as refused:
        load(directory)
    assert "\n" not in str(refused.value)
