"""The engine contract's text, for real tokenizers of each family's shape (made here with the
`tokenizers` library from generated text, nothing from a hub): SentencePiece with a leading-space
marker and byte fallback (Llama 2, Mistral) and byte-level BPE (Llama 3, Qwen), each with its
family's real chat template (tests/unit/upstream/chat_templates.json) and special tokens.

The front door runs whole, on a socket, before a stand-in of the `tensorrt_llm` model that answers
with the ids of generated text (spaces, punctuation, emoji, CJK, accents), a few per response as
the engine's streaming responses hold the ids since the previous one. For every family and case:
the text streamed == the text answered unstreamed == decode(all ids); usage counts the ids; the
finish reason is the end id's or the length's; the prompt reaches the engine as transformers'
apply_chat_template(tokenize=True) encodes it, so with one BOS at most."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from llm_operator.frontdoor.protocol import Limits
from llm_operator.frontdoor.server import FrontDoor, Settings, serve
from llm_operator.frontdoor.tokenizer import Tokenizer
from llm_operator.frontdoor.upstream import Upstream
from tokenizers import Tokenizer as RawTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer

from tests.unit.test_frontdoor_server import STREAM_HEAD, events, exchange, fake_triton, sse

TEMPLATES = {
    t["name"]: t["template"]
    for t in json.loads((Path(__file__).parent / "upstream" / "chat_templates.json").read_text())["templates"]
}
WORDS = ("the", "engine", "streams", "tokens", "over", "a", "socket", "Grüß", "café", "naïve", "über",
         "hello", "world", "sentence", "piece", "model")  # fmt: skip
ODD = (
    "日本語",
    "中文字",
    "🙂",
    "🚀",
    "👩\u200d💻",
    "—",
    ",",
    ".",
    "!",
    "?",
    "'",
    '"',
    "(",
    ")",
    "  ",
    "\n",
    "1234",
    "€",
)


def text(rng: random.Random, words: int) -> str:
    """Words and odd pieces, mostly space-separated, sometimes glued, sometimes led by a space."""
    parts = [rng.choice(WORDS) if rng.random() < 0.6 else rng.choice(ODD) for _ in range(words)]
    out = "".join(p + rng.choice(("", " ", " ", " ")) for p in parts)
    return (" " if rng.random() < 0.3 else "") + out.strip(" ") if out.strip() else "hello"


def corpus() -> list[str]:
    rng = random.Random(7)
    return [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(300)]


def sentencepiece(directory: Path) -> None:
    """Llama 2's layout: `▁` for spaces, prepended to the text; byte-fallback ids <0xNN> for what
    the vocabulary lacks (emoji, CJK here); BOS added by the tokenizer (add_bos_token)."""
    specials = ["<unk>", "<s>", "</s>"]
    tok = RawTokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    alphabet = sorted({c for line in corpus() for c in line.replace(" ", "▁")} | {"▁"})
    fallback = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False, initial_alphabet=alphabet,
                                  special_tokens=[*specials, *fallback])  # fmt: skip
    tok.train_from_iterator(corpus(), trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False, "legacy": False,
              "clean_up_tokenization_spaces": False}  # fmt: skip
    (directory / "tokenizer_config.json").write_text(json.dumps(config))


def byte_level(directory: Path, specials: list[str], bos: str | None, eos: str) -> None:
    """Llama 3's and Qwen's layout: GPT-2's byte alphabet, so every byte sequence has ids; Llama
    3's tokenizer adds its BOS, Qwen's nothing."""
    tok = RawTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, show_progress=False, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(corpus(), trainer)
    if bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))]
        )
    tok.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
              "clean_up_tokenization_spaces": False}  # fmt: skip
    (directory / "tokenizer_config.json").write_text(json.dumps(config))


LLAMA3 = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
FAMILIES: dict[str, tuple[str, Callable[[Path], None]]] = {
    "llama-2": ("llama-2", sentencepiece),
    "mistral": ("mixtral", sentencepiece),
    "llama-3": ("llama-3", lambda d: byte_level(d, LLAMA3, "<|begin_of_text|>", "<|eot_id|>")),
    "qwen": ("qwen2.5", lambda d: byte_level(d, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None,
                                             "<|im_end|>")),
}  # fmt: skip


def directory(tmp_path: Path, family: str) -> Path:
    template, make = FAMILIES[family]
    make(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["chat_template"] = TEMPLATES[template]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize("family", list(FAMILIES))
def test_streamed_and_unstreamed_text_is_the_text_of_all_the_engines_ids(tmp_path: Path, family: str) -> None:
    where = directory(tmp_path, family)
    ours, theirs = Tokenizer.load(where), AutoTokenizer.from_pretrained(str(where))  # type: ignore[no-untyped-call]
    assert ours.end_id is not None
    rng = random.Random(family)
    case: dict[str, Any] = {}
    seen: list[dict[str, Any]] = []

    async def engine(w: asyncio.StreamWriter) -> None:
        """The ids since the previous response, 1 to 3 of them, one number or a list."""
        body, rest = b"", list(case["ids"])
        while rest:
            n = rng.randint(1, 3)
            step, rest = rest[:n], rest[n:]
            body += sse({"output_ids": step[0] if len(step) == 1 else step, "sequence_length": len(step)})
        w.write(STREAM_HEAD + body + b"0\r\n\r\n")
        await w.drain()

    async def ask(port: int, body: dict[str, Any]) -> tuple[str, dict[str, Any], str]:
        status, raw = await exchange(port, body, "/v1/chat/completions")
        assert status == 200, raw
        if not body["stream"]:
            answer = json.loads(raw.split(b"\r\n\r\n", 1)[1])
            return (
                answer["choices"][0]["message"]["content"],
                answer["usage"],
                answer["choices"][0]["finish_reason"],
            )
        chunks = [json.loads(e) for e in events(raw)[:-1]]
        streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]
        return streamed, chunks[-1]["usage"], finish

    async def go() -> None:
        triton = await fake_triton(engine, seen)
        upstream = Upstream("127.0.0.1", triton.sockets[0].getsockname()[1])
        door = FrontDoor(
            Settings(["m"], "tensorrt_llm", "tensorrt-engine", Limits(4096, 8192)), ours, upstream
        )
        server = await serve(door, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            for _ in range(12):
                output = text(rng, rng.randint(1, 14))
                ended = rng.random() < 0.5  # on the end id, or at max_tokens
                ids = ours.encode(output, add_special_tokens=False) + ([ours.end_id] if ended else [])
                case["ids"] = ids
                messages = [{"role": "user", "content": text(rng, rng.randint(1, 8))}]
                if family != "mistral":  # Mixtral's template refuses a system message
                    messages.insert(0, {"role": "system", "content": "Answer in words 🙂."})
                want = ours.backend.decode(ids, skip_special_tokens=True)
                prompt = theirs.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
                for stream in (True, False):
                    body = {"model": "m", "messages": messages, "max_tokens": len(ids), "stream": stream,
                            **({"stream_options": {"include_usage": True}} if stream else {})}  # fmt: skip
                    got, usage, finish = await ask(port, body)
                    assert got == want, (family, output, ids)
                    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (len(prompt), len(ids))
                    assert finish == ("stop" if ended else "length")
                    assert seen[-1]["input_ids"] == prompt  # the template's BOS only, if any
                    bos = theirs.bos_token_id
                    assert bos is None or prompt.count(bos) == (
                        1 if "bos_token" in TEMPLATES[FAMILIES[family][0]] else 0
                    )
        finally:
            server.close()
            triton.close()

    asyncio.run(go())
