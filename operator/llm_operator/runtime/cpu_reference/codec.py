"""The codec between a served model's text and its ids, free of torch: the ensemble (ensemble.py)
encodes and decodes with it and loads no weights; the decoder's models (served.py) use the same.

- LLMOP_MODEL_DIR set: a packaged model's layout (gguf_files: model.gguf beside tokenizer.json) has
  its tokenizer; checkpoint.py's format has the byte tokenizer;
- else the builtin model config.pbtxt names: a packaged model's tokenizer, or tiny-llama's bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llm_operator.runtime.cpu_reference import PACKAGED_MODELS, packaged_dir
from llm_operator.runtime.cpu_reference.gguf_files import WEIGHTS_FILE

Pieces = Callable[[int], str]  # each generated id -> the text it completes (maybe "")


@dataclass(frozen=True)
class Codec:
    encode: Callable[[str], list[int]]
    pieces: Callable[[], Pieces]  # a new incremental decoder, one per request


# TinyLM (tiny_lm.encode): UTF-8 bytes in; it generates printable ASCII only.
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

    return Codec(encode=lambda text: tok.encode(text, add_special_tokens=False).ids, pieces=pieces)


def load(builtin: str, model_dir: str) -> Codec:
    """The codec of the model served.load serves for the same arguments (which says why a model
    cannot be served: this only picks the codec)."""
    if model_dir:
        directory = Path(model_dir)
        return tokenizer_codec(directory) if (directory / WEIGHTS_FILE).is_file() else BYTES
    if builtin in PACKAGED_MODELS:
        return tokenizer_codec(Path(packaged_dir(builtin)))
    return BYTES
