"""The cpu-reference models' Hugging Face tokenizer directory, generated rather than committed: a
byte-level BPE without merges whose ids are exactly the bytes tiny_lm.encode feeds the model (UTF-8,
no BOS or EOS: the model has neither), and a ChatML chat template, so the front door templates and
counts the CPU models with the same code as any Hugging Face model.

The cpu-runtime image writes it at build time to contract.CPU_REFERENCE_TOKENIZER_DIR:
    python -m llm_operator.runtime.cpu_reference.tokenizer_files DIRECTORY
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

# ChatML (as Qwen2's), taking OpenAI's text content parts as well as plain strings.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'text' %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def byte_symbols() -> list[str]:
    """The printable character GPT-2's byte-level pre-tokenizer writes for each byte 0..255 (the
    `tokenizers` ByteLevel alphabet): printable Latin-1 stands for itself, the rest is shifted
    past 255."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    symbols, shifted = {}, 0
    for byte in range(256):
        if byte in printable:
            symbols[byte] = chr(byte)
        else:
            symbols[byte] = chr(256 + shifted)
            shifted += 1
    return [symbols[b] for b in range(256)]


def tokenizer() -> Tokenizer:
    vocab = {symbol: byte for byte, symbol in enumerate(byte_symbols())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def tokenizer_config() -> dict[str, object]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",  # what AutoTokenizer loads (aiperf --tokenizer)
        "chat_template": CHAT_TEMPLATE,
        "bos_token": None,
        "eos_token": None,
        "added_tokens_decoder": {},
        "clean_up_tokenization_spaces": False,
    }


def write(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer().save(str(directory / "tokenizer.json"), pretty=True)
    text = json.dumps(tokenizer_config(), indent=2, sort_keys=True) + "\n"
    (directory / "tokenizer_config.json").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m llm_operator.runtime.cpu_reference.tokenizer_files DIRECTORY")
    write(Path(sys.argv[1]))
