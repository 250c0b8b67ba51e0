"""What a cpu-reference repository serves: its Decoder (load) and the codec between its text and its
ids (codec: the tokenizer alone, for the ensemble, which loads no weights). This module imports no
torch: the decoders' modules load inside load().

- LLMOP_MODEL_DIR set: the cached checkpoint the operator mounted: checkpoint.py's format (a tiny
  model with the byte tokenizer), or a directory laid out as a packaged model's (gguf_files.write:
  model.gguf and its tokenizer files);
- else the builtin model config.pbtxt names: tiny-llama drawn from its weights_seed, or a packaged
  model from the image's builtin model directory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llm_operator.runtime.cpu_reference import PACKAGED_MODELS, TINY_MODELS, gguf_files, packaged_dir

if TYPE_CHECKING:
    from llm_operator.runtime.cpu_reference.tiny_lm import Decoder

Pieces = Callable[[int], str]  # each generated id -> the text it completes (maybe "")


@dataclass(frozen=True)
class Codec:
    encode: Callable[[str], list[int]]
    pieces: Callable[[], Pieces]  # a new incremental decoder, one per request
    tokenizer_file: str = ""  # its tokenizer.json (guided decoding reads the vocabulary); "": bytes


# TinyLM's (tiny_lm.encode): UTF-8 bytes in; it generates printable ASCII only.
BYTES = Codec(encode=lambda text: list(text.encode("utf-8")), pieces=lambda: chr)


def tokenizer_codec(directory: Path) -> Codec:
    """The model's tokenizer.json: the prompt (chat template already rendered) encoded as written,
    special tokens matched, none added; output decoded incrementally, so a character split across
    tokens is sent once whole and special tokens (the end token) add no text."""
    from tokenizers import Tokenizer
    from tokenizers.decoders import DecodeStream

    tok = Tokenizer.from_file(str(directory / "tokenizer.json"))

    def pieces() -> Pieces:
        stream = DecodeStream(skip_special_tokens=True)
        return lambda token: stream.step(tok, token) or ""

    return Codec(encode=lambda text: tok.encode(text, add_special_tokens=False).ids, pieces=pieces,
                 tokenizer_file=str(directory / "tokenizer.json"))  # fmt: skip


def _packaged(model_dir: str) -> bool:
    return bool(model_dir) and (Path(model_dir) / gguf_files.WEIGHTS_FILE).is_file()


def codec(builtin: str, model_dir: str) -> Codec:
    """The codec of the model load() serves for the same arguments (load says why a model cannot
    be served: this only picks the tokenizer)."""
    if _packaged(model_dir):
        return tokenizer_codec(Path(model_dir))
    if not model_dir and builtin in PACKAGED_MODELS:
        return tokenizer_codec(Path(packaged_dir(builtin)))
    return BYTES


def load(builtin: str, weights_seed: int, model_dir: str) -> tuple[Decoder, Codec]:
    """ValueError (CheckpointError included) says why the model cannot be served."""
    from llm_operator.runtime.cpu_reference import checkpoint  # torch: only here
    from llm_operator.runtime.cpu_reference.tiny_lm import TinyLM

    if model_dir:
        if _packaged(model_dir):
            return packaged(Path(model_dir))
        return checkpoint.load(model_dir), BYTES
    if not builtin:  # the operator renders no builtin name for a cached source
        raise ValueError(
            "LLMOP_MODEL_DIR is not set: this repository serves a cached model, whose directory goes there"
        )
    if builtin in TINY_MODELS:
        return TinyLM(TINY_MODELS[builtin], seed=weights_seed), BYTES
    if builtin in PACKAGED_MODELS:
        return packaged(Path(packaged_dir(builtin)))
    raise ValueError(f"unknown builtin model {builtin!r}")


def packaged(directory: Path) -> tuple[Decoder, Codec]:
    from llm_operator.runtime.cpu_reference.gguf_lm import GgufLM  # torch and gguf: only here

    return GgufLM(directory / gguf_files.WEIGHTS_FILE), tokenizer_codec(directory)
