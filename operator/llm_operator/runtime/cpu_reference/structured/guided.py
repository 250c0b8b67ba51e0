"""Guided decoding of the CPU runtime with xgrammar, the library TensorRT-LLM's guided decoder uses
(docs/architecture.md, "Structured outputs ... the design"): a request's guide (the engine
contract's guided_decoding_guide_type and guided_decoding_guide) compiles to a grammar, and each
sequence gets a Matcher that says which ids may come next and follows the ids picked.

The guide types are the C++ backend's (`json`, `json_schema`, `regex`, `ebnf_grammar`); schemas
compile with any_whitespace=False, so a schema of bounded values has a finite language and the
random tiny model always reaches its end (a deviation no client can see: the output is in the
language upstream's free-whitespace grammar allows).

xgrammar is imported on the first guided request only: its import costs seconds, and most
deployments never send one. The cpu-runtime image installs it without its dependencies
(requirements/image-cpu-runtime.lock); it imports three names from transformers that only its
Hugging Face helpers use, so where transformers is absent (the image) a stand-in module gives them
(STAND_IN).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import types
from collections.abc import Sequence
from typing import Any

import torch

GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar")

# What xgrammar 0.2.9 reads of transformers at import: tokenizer_info's two classes (for its
# from_huggingface) and contrib.hf's base class (its transformers generate() processor).
STAND_IN = ("PreTrainedTokenizerBase", "PreTrainedTokenizerFast", "LogitsProcessor")

_xgr: Any = None
_lock = threading.Lock()


def _xgrammar() -> Any:
    global _xgr
    with _lock:
        if _xgr is None:
            # tvm-ffi would JIT a torch extension at import (seconds, a compiler): not needed on CPU.
            os.environ.setdefault("TVM_FFI_DISABLE_TORCH_C_DLPACK", "1")
            try:
                import transformers  # noqa: F401
            except ImportError:
                stand_in = types.ModuleType("transformers")
                for name in STAND_IN:
                    setattr(stand_in, name, type(name, (), {}))
                sys.modules["transformers"] = stand_in
            _xgr = importlib.import_module("xgrammar")  # typed Any: the dev venv may predate it
    return _xgr


class Vocabulary:
    """What xgrammar needs to know of the model's tokenizer, as TensorRT-LLM's tokenizer info file
    holds it (encoded_vocab, the tokenizer's metadata, stop_token_ids), read on the first guided
    request: a model that is never guided loads no sooner for it."""

    def __init__(self, encoded: Sequence[bytes | str], vocab_size: int, stop_ids: Sequence[int],
                 tokenizer_file: str = "") -> None:  # fmt: skip
        """`encoded`: the ids' tokens, or none where `tokenizer_file` (a tokenizer.json) has them."""
        self.encoded, self.vocab_size, self.stop_ids = list(encoded), vocab_size, list(stop_ids)
        self.tokenizer_file = tokenizer_file
        self._compiler: Any = None

    @classmethod
    def of_bytes(cls, vocab_size: int) -> Vocabulary:
        """TinyLM's: token i is byte i; it has no end token."""
        return cls([bytes([i]) for i in range(256)], vocab_size, [])

    @classmethod
    def of_tokenizer(cls, path: str, vocab_size: int, stop_ids: Sequence[int]) -> Vocabulary:
        """A tokenizer.json's vocabulary, its type (byte-level, byte-fallback or raw) read from it."""
        return cls([], vocab_size, stop_ids, path)

    @classmethod
    def of_model(cls, tokenizer_file: str, vocab_size: int, end_id: int | None) -> Vocabulary:
        """A served model's: its tokenizer.json's (ending on its end token), or TinyLM's bytes."""
        if not tokenizer_file:
            return cls.of_bytes(vocab_size)
        return cls.of_tokenizer(tokenizer_file, vocab_size, [] if end_id is None else [end_id])

    def compiler(self) -> Any:
        if self._compiler is None:
            xgr = _xgrammar()
            metadata: dict[str, Any] = {"vocab_type": xgr.VocabType.RAW}
            if self.tokenizer_file:
                from tokenizers import Tokenizer

                with open(self.tokenizer_file, encoding="utf-8") as f:
                    text = f.read()
                vocab = Tokenizer.from_str(text).get_vocab(with_added_tokens=True)
                self.encoded = [""] * (max(vocab.values(), default=-1) + 1)
                for token, index in vocab.items():
                    self.encoded[index] = token
                # As TokenizerInfo.from_huggingface reads a fast tokenizer's backend.
                metadata = xgr.TokenizerInfo._detect_metadata_from_hf(text)
            info = xgr.TokenizerInfo(
                self.encoded, vocab_size=self.vocab_size, stop_token_ids=self.stop_ids, **metadata
            )
            self._compiler = xgr.GrammarCompiler(info)
        return self._compiler

    def grammar(self, guide_type: str, guide: str) -> Any:
        """The compiled grammar; ValueError says why the guide cannot be used."""
        if guide_type not in GUIDE_TYPES:
            raise ValueError(f"guided_decoding_guide_type must be one of {', '.join(GUIDE_TYPES)}")
        compiler = self.compiler()
        try:
            if guide_type == "json":
                return compiler.compile_builtin_json_grammar()
            if guide_type == "json_schema":
                return compiler.compile_json_schema(guide, any_whitespace=False)
            if guide_type == "regex":
                return compiler.compile_regex(guide)
            return compiler.compile_grammar(guide)
        except Exception as e:  # xgrammar raises RuntimeError or its own errors for a bad guide
            raise ValueError(f"guided_decoding_guide does not compile as {guide_type}: {e}") from None


def check_schema(guide: str) -> str | None:
    """Why a json_schema guide is not a JSON object (None: it is), before compiling."""
    try:
        schema = json.loads(guide)
    except ValueError:
        return "guided_decoding_guide is not JSON"
    return None if isinstance(schema, dict) else "guided_decoding_guide must be a JSON object"


class Matcher:
    """One sequence's place in its grammar."""

    def __init__(self, grammar: Any, vocab_size: int) -> None:
        xgr = _xgrammar()
        self.matcher = xgr.GrammarMatcher(grammar)
        self.vocab_size = vocab_size
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self._fill = xgr.GrammarMatcher.fill_next_token_bitmask
        self._bits = torch.arange(32, dtype=torch.int32)

    def allowed(self) -> torch.Tensor:
        """Bool [vocab]: the ids the grammar allows next (only stop ids once it is complete)."""
        self._fill(self.matcher, self.bitmask)
        # Bit j of word w allows id 32w + j. (xgrammar's apply_token_bitmask_inplace takes float32
        # logits only; TinyLM's are float64.)
        words: torch.Tensor = self.bitmask[0, :, None]
        allowed: torch.Tensor = ((words >> self._bits) & 1).reshape(-1)[: self.vocab_size].bool()
        return allowed

    def accept(self, token: int) -> None:
        if not self.matcher.accept_token(token):
            raise RuntimeError(f"the grammar refused id {token}, which its mask allowed")
