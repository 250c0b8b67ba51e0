"""The cpu-reference backend's checkpoint: a model directory laid out as a Hugging Face one, so the
model cache fetches, verifies and serves it as it would any other (docs/architecture.md, "The model
cache"):

    config.json            {"model_type": "llm-operator-tiny", LlamaConfig's shape keys, "torch_dtype"}
    model.safetensors      embed, layers.<i>.{q,k,v,o,gate,up,down}, lm_head (tiny_lm.tensor_shapes)
    tokenizer.json         \\ the byte-level tokenizer and ChatML template of every cpu-reference
    tokenizer_config.json  / model (tokenizer_files.py): the directory is also the tokenizer directory

Write one (the test world's S3 and Hugging Face repositories are made this way):
    python -m llm_operator.runtime.cpu_reference.checkpoint DIRECTORY [--model tiny-llama] [--seed N]
Seed N holds the weights builtin://tiny-llama serves with weights_seed N, so seed 0 and seed 1 are
two models with different text.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from llm_operator.runtime.cpu_reference import TINY_MODELS, TinyConfig, tokenizer_files
from llm_operator.runtime.cpu_reference.tiny_lm import TinyLM, seeded_tensors

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
MODEL_TYPE = "llm-operator-tiny"
# config.json key (transformers' LlamaConfig names) -> TinyConfig field.
CONFIG_KEYS = {
    "num_hidden_layers": "layers",
    "hidden_size": "hidden",
    "num_attention_heads": "heads",
    "num_key_value_heads": "kv_heads",
    "intermediate_size": "ffn",
    "vocab_size": "vocab",
    "max_position_embeddings": "max_positions",
}
FORMAT = (
    f"a cpu-reference checkpoint holds {CONFIG_FILE}, {WEIGHTS_FILE}, tokenizer.json "
    "and tokenizer_config.json (python -m llm_operator.runtime.cpu_reference.checkpoint "
    "writes one)"
)


class CheckpointError(ValueError):
    """A directory that is not a cpu-reference checkpoint; the message is one line naming the file
    and what is wrong."""


def config_json(config: TinyConfig) -> dict[str, object]:
    return {
        "model_type": MODEL_TYPE,
        **{key: getattr(config, field) for key, field in CONFIG_KEYS.items()},
        "torch_dtype": "float64",
    }


def parse_config(data: Any, where: Path) -> TinyConfig:
    if not isinstance(data, dict):
        raise CheckpointError(f"{where} must hold a JSON object")
    if data.get("model_type") != MODEL_TYPE:
        raise CheckpointError(
            f'{where}: model_type is not "{MODEL_TYPE}": the cpu-reference backend serves only its '
            "own tiny checkpoints"
        )
    shape = {}
    for key, field in CONFIG_KEYS.items():
        if key not in data:
            raise CheckpointError(f"{where} has no {key!r}")
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(f"{where}: {key} must be a positive integer")
        shape[field] = value
    config = TinyConfig(**shape)
    if config.hidden % config.heads or config.heads % config.kv_heads or config.head_dim % 2:
        raise CheckpointError(
            f"{where}: hidden_size must split into an even head size per attention head, and "
            "num_attention_heads into groups of num_key_value_heads"
        )
    return config


def write(directory: str | Path, model: str = "tiny-llama", seed: int = 0) -> None:
    directory = Path(directory)
    config = TINY_MODELS[model]
    directory.mkdir(parents=True, exist_ok=True)
    text = json.dumps(config_json(config), indent=2) + "\n"
    (directory / CONFIG_FILE).write_text(text, encoding="utf-8")
    # "format": "pt" as transformers writes it: the tensors are torch's. Written as bytes: save_file
    # creates its file 0600, which a serving pod of another uid could not read.
    weights = save(seeded_tensors(config, seed), metadata={"format": "pt"})
    (directory / WEIGHTS_FILE).write_bytes(weights)
    tokenizer_files.write(directory)


def read_config(directory: str | Path) -> TinyConfig:
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{path} not found: {FORMAT}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path} is not readable JSON ({e})") from None
    return parse_config(data, path)


def load(directory: str | Path) -> TinyLM:
    """The model of a checkpoint directory (its tokenizer is the front door's business)."""
    config = read_config(directory)
    path = Path(directory) / WEIGHTS_FILE
    if not path.is_file():
        raise CheckpointError(f"{path} not found: {FORMAT}")
    try:
        tensors: dict[str, torch.Tensor] = load_file(str(path))
    except (OSError, SafetensorError) as e:
        raise CheckpointError(f"{path} is not a safetensors file ({e})") from None
    try:
        return TinyLM.from_tensors(config, tensors)
    except ValueError as e:
        raise CheckpointError(f"{path}: {e} ({CONFIG_FILE} gives the shapes)") from None


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m llm_operator.runtime.cpu_reference.checkpoint",
        description="Write a cpu-reference checkpoint directory (config, weights, tokenizer).",
    )
    parser.add_argument("directory", type=Path)
    parser.add_argument("--model", choices=sorted(TINY_MODELS), default="tiny-llama")
    parser.add_argument("--seed", type=int, default=0, help="builtin://MODEL's weights_seed (default 0)")
    args = parser.parse_args(argv)
    write(args.directory, args.model, args.seed)


if __name__ == "__main__":
    main()
