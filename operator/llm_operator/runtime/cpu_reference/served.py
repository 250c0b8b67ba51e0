"""What a cpu-reference repository serves: its Decoder and the codec between its text and its ids
(codec.py).

- LLMOP_MODEL_DIR set: the cached checkpoint the operator mounted: checkpoint.py's format (a tiny
  model with the byte tokenizer), or a directory laid out as a packaged model's (gguf_files.write:
  model.gguf and its tokenizer files);
- else the builtin model config.pbtxt names: tiny-llama drawn from its weights_seed, or a packaged
  model from the image's builtin model directory.
"""

from __future__ import annotations

from pathlib import Path

from llm_operator.runtime.cpu_reference import (
    PACKAGED_MODELS,
    TINY_MODELS,
    checkpoint,
    codec,
    gguf_files,
    packaged_dir,
)
from llm_operator.runtime.cpu_reference.codec import Codec
from llm_operator.runtime.cpu_reference.tiny_lm import Decoder, TinyLM


def load(builtin: str, weights_seed: int, model_dir: str) -> tuple[Decoder, Codec]:
    """ValueError (CheckpointError included) says why the model cannot be served."""
    if model_dir:
        if (Path(model_dir) / gguf_files.WEIGHTS_FILE).is_file():
            return packaged(Path(model_dir))
        return checkpoint.load(model_dir), codec.BYTES
    if not builtin:  # the operator renders no builtin name for a cached source
        raise ValueError(
            "LLMOP_MODEL_DIR is not set: this repository serves a cached model, whose directory goes there"
        )
    if builtin in TINY_MODELS:
        return TinyLM(TINY_MODELS[builtin], seed=weights_seed), codec.BYTES
    if builtin in PACKAGED_MODELS:
        return packaged(Path(packaged_dir(builtin)))
    raise ValueError(f"unknown builtin model {builtin!r}")


def packaged(directory: Path) -> tuple[Decoder, Codec]:
    from llm_operator.runtime.cpu_reference.gguf_lm import GgufLM  # torch and gguf: only here

    return GgufLM(directory / gguf_files.WEIGHTS_FILE), codec.tokenizer_codec(directory)
