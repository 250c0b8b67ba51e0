"""Tokenizer.load reads a Hugging Face tokenizer directory as transformers does (template, special
tokens, the post-processor's BOS/EOS), counts as TensorRT-LLM's preprocessing encodes, and names the
file when a directory cannot be used. The cpu-reference directory counts exactly the model's ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from llm_operator.frontdoor.chat import render_chat
from llm_operator.frontdoor.tokenizer import Tokenizer, TokenizerError
from llm_operator.runtime.cpu_reference import tiny_lm, tokenizer_files
from tokenizers import Tokenizer as RustTokenizer
from tokenizers import models, pre_tokenizers, processors
from transformers import AutoTokenizer


def hf_load(directory: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(directory))  # type: ignore[no-untyped-call]


TEXTS = [
    "Hello, world!",
    "Grüß Gott, ça va? 日本語のテキスト 🙂👍🏽",
    "  leading and trailing spaces \n\n\ttabs\r\n",
    "<|im_start|>user\nnot special here<|im_end|>",
    "\x00\x7f\u200b",
    "",
]


@pytest.fixture(scope="module")
def cpu_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("cpu-reference-tokenizer")
    tokenizer_files.write(directory)
    return directory


@pytest.mark.parametrize("text", TEXTS)
def test_the_cpu_reference_tokenizer_counts_the_ids_the_model_consumes(
    cpu_reference: Path, text: str
) -> None:
    tok = Tokenizer.load(cpu_reference)
    assert tok.encode(text) == tiny_lm.encode(text)
    assert tok.count(text) == len(tiny_lm.encode(text)) == len(text.encode("utf-8"))
    assert tok.backend.decode(tok.encode(text)) == tiny_lm.decode(tiny_lm.encode(text))


def test_the_cpu_reference_directory_is_one_transformers_loads_alike(cpu_reference: Path) -> None:
    """Benchmark clients load it with AutoTokenizer (aiperf --tokenizer): same ids, same chat
    prompt as the front door renders; no BOS or EOS, as the model has none."""
    tok = Tokenizer.load(cpu_reference)
    hf = hf_load(cpu_reference)
    for text in TEXTS:
        assert hf.encode(text) == tok.encode(text)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Grüß dich 🙂"}]
    assert tok.chat_template is not None
    prompt = render_chat(tok.chat_template, messages, bos_token=tok.bos_token, eos_token=tok.eos_token)
    assert prompt == hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nGrüß dich 🙂<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    parts = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}],
        }
    ]
    assert render_chat(tok.chat_template, parts) == "<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n"
    assert (tok.bos_token, tok.eos_token) == ("", "")


def test_the_cpu_reference_directory_is_generated_identically(tmp_path: Path, cpu_reference: Path) -> None:
    tokenizer_files.write(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / name).read_bytes() == (cpu_reference / name).read_bytes()


def _word_tokenizer(directory: Path, post_processor: Any = None, **config: Any) -> Path:
    """A small real tokenizer.json (words, two special tokens) and its tokenizer_config.json."""
    vocab = {"<s>": 0, "</s>": 1, "<unk>": 2, "hello": 3, "world": 4, "!": 5}
    backend = RustTokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_special_tokens(["<s>", "</s>"])
    if post_processor is not None:
        backend.post_processor = post_processor
    directory.mkdir(parents=True, exist_ok=True)
    backend.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


BOS_FIRST = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 0)])


@pytest.mark.parametrize(
    ("post_processor", "config", "expected"),
    [
        # The post-processor's BOS counts: preprocessing encodes with add_special_tokens true.
        (BOS_FIRST, {"tokenizer_class": "PreTrainedTokenizerFast"}, [0, 3, 4, 5]),
        (None, {"tokenizer_class": "PreTrainedTokenizerFast"}, [3, 4, 5]),
        # Llama's and Gemma's classes rebuild it from add_bos_token / add_eos_token (BOS by default).
        (
            None,
            {"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"},
            [0, 3, 4, 5],
        ),
        (
            BOS_FIRST,
            {
                "tokenizer_class": "LlamaTokenizer",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "add_bos_token": False,
            },
            [3, 4, 5],
        ),
        (
            None,
            {
                "tokenizer_class": "GemmaTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "add_eos_token": True,
            },
            [0, 3, 4, 5, 1],
        ),
    ],
)
def test_counts_the_special_tokens_transformers_adds(
    tmp_path: Path, post_processor: Any, config: dict[str, Any], expected: list[int]
) -> None:
    directory = _word_tokenizer(tmp_path / "tok", post_processor, **config)
    tok = Tokenizer.load(directory)
    assert tok.encode("hello world!") == expected
    assert tok.count("hello world!") == len(expected)
    assert hf_load(directory).encode("hello world!") == expected
    assert tok.count("hello world!", add_special_tokens=False) == 3


def test_reads_the_template_and_the_special_tokens_as_transformers_does(tmp_path: Path) -> None:
    added = {"__type": "AddedToken", "content": "</s>", "lstrip": False, "normalized": False, "rstrip": False}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": added,
        "chat_template": [
            {"name": "tool_use", "template": "TOOLS {{ messages[0].content }}"},
            {"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"},
        ],
    }
    directory = _word_tokenizer(tmp_path / "tok", **config)
    tok = Tokenizer.load(directory)
    hf = hf_load(directory)
    assert (tok.bos_token, tok.eos_token) == (hf.bos_token, hf.eos_token) == ("<s>", "</s>")
    messages = [{"role": "user", "content": "hi"}]
    assert tok.chat_template is not None
    assert render_chat(tok.chat_template, messages, bos_token=tok.bos_token, eos_token=tok.eos_token) == (
        hf.apply_chat_template(messages, tokenize=False)
    )
    # A chat_template.jinja beside the config takes priority, as in transformers >= 4.43.
    (directory / "chat_template.jinja").write_text("J{{ messages[0].content }}")
    assert Tokenizer.load(directory).chat_template == "J{{ messages[0].content }}"
    assert hf_load(directory).chat_template == "J{{ messages[0].content }}"


def test_a_legacy_directory_takes_its_special_tokens_from_special_tokens_map(tmp_path: Path) -> None:
    directory = _word_tokenizer(tmp_path / "tok", tokenizer_class="PreTrainedTokenizerFast", eos_token="<s>")
    (directory / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": {"content": "<s>"}, "eos_token": "</s>"})
    )
    tok, hf = Tokenizer.load(directory), hf_load(directory)
    assert (tok.bos_token, tok.eos_token) == (hf.bos_token, hf.eos_token) == ("<s>", "</s>")


def test_a_directory_without_config_or_template(tmp_path: Path) -> None:
    directory = _word_tokenizer(tmp_path / "tok")
    (directory / "tokenizer_config.json").unlink()
    tok = Tokenizer.load(directory)
    assert (tok.chat_template, tok.bos_token, tok.eos_token) == (None, "", "")
    assert tok.count("hello") == 1


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        (lambda d: (d / "tokenizer.json").unlink(), r"tok/tokenizer\.json is missing"),
        (
            lambda d: (d / "tokenizer.json").write_text('{"model": 1}'),
            r"tok/tokenizer\.json is not a tokenizer",
        ),
        (
            lambda d: (d / "tokenizer_config.json").write_text("{not json"),
            r"tok/tokenizer_config\.json is not valid JSON",
        ),
        (
            lambda d: (d / "tokenizer_config.json").write_text("[]"),
            r"tok/tokenizer_config\.json must hold a JSON object",
        ),
        (
            lambda d: (d / "tokenizer_config.json").write_text(
                json.dumps({"chat_template": [{"name": "rag", "template": "x"}]})
            ),
            r"tokenizer_config\.json: chat_template names templates \['rag'\] but none is \"default\"",
        ),
        (
            lambda d: (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": 3})),
            r"tokenizer_config\.json: chat_template must be a string or a list",
        ),
        (
            lambda d: (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": ["</s>"]})),
            r"tokenizer_config\.json: eos_token must be a string, an AddedToken object or null",
        ),
        (
            lambda d: (d / "tokenizer_config.json").write_text(
                json.dumps({"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<bos>"})
            ),
            r"tokenizer_config\.json: the special token '<bos>' is not in the tokenizer's vocabulary",
        ),
    ],
)
def test_a_broken_directory_is_refused_naming_the_file(tmp_path: Path, broken: Any, message: str) -> None:
    directory = _word_tokenizer(tmp_path / "tok")
    broken(directory)
    with pytest.raises(TokenizerError, match=message):
        Tokenizer.load(directory)


WRITES_BOS = [t for t in json.loads((Path(__file__).parent / "upstream" / "chat_templates.json").read_text())[
    "templates"] if "bos_token" in t["template"]]  # fmt: skip


@pytest.mark.parametrize("upstream", WRITES_BOS, ids=[t["name"] for t in WRITES_BOS])
def test_a_template_that_writes_bos_reaches_the_engine_with_one(
    tmp_path: Path, upstream: dict[str, Any]
) -> None:
    """Byte-level BPE with a BOS post-processor (Llama 3's shape) under each upstream template that
    writes bos_token: the ids the engine makes of the front door's text (adding special tokens, as
    preprocessing does) are apply_chat_template(tokenize=True)'s: one BOS, not the engine's and the
    template's."""
    backend = tokenizer_files.tokenizer()
    bos, eos = upstream["bos_token"], upstream["eos_token"]
    backend.add_special_tokens([bos, eos])
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, backend.token_to_id(bos))]
    )
    backend.save(str(tmp_path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
              "chat_template": upstream["template"]}  # fmt: skip
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok, hf = Tokenizer.load(tmp_path), hf_load(tmp_path)
    messages = [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Hi."},
                {"role": "user", "content": "Grüß dich 🙂"}]  # fmt: skip
    assert tok.chat_template is not None
    rendered = render_chat(tok.chat_template, messages, bos_token=bos, eos_token=eos)
    engine_ids = tok.encode(tok.chat_prompt(rendered))
    assert engine_ids == hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    bos_id = backend.token_to_id(bos)
    assert engine_ids[0] == bos_id != engine_ids[1]  # one BOS first (Llama 2 writes one per turn)


def test_bos_text_is_kept_where_dropping_it_would_change_the_first_word(tmp_path: Path) -> None:
    """SentencePiece marking only the text's first word (Metaspace, prepend_scheme "first"): after
    the template's BOS the word is not first; without it, it would be. Only ids can fix that."""
    vocab = {"<s>": 0, "</s>": 1, "<unk>": 2, "▁hi": 3, "hi": 4}
    backend = RustTokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    backend.add_special_tokens(["<s>", "</s>"])
    backend.post_processor = BOS_FIRST
    backend.save(str(tmp_path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = Tokenizer.load(tmp_path)
    assert tok.encode("<s>hi", add_special_tokens=False) == [0, 4] and tok.encode("hi") == [0, 3]
    assert tok.chat_prompt("<s>hi") == "<s>hi"
