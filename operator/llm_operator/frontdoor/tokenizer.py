"""A Hugging Face tokenizer directory, read as TensorRT-LLM's preprocessing model reads it, without
transformers: tokenizer.json through the `tokenizers` library, tokenizer_config.json (and
chat_template.jinja, special_tokens_map.json) for the chat template and the special tokens.

On the engine contract this is the one tokenizer of a request (prompt_ids: what the engine gets;
engine.py decodes what it returns). A completion's prompt is encoded as preprocessing encodes it
(`tokenizer.encode(text, add_special_tokens=...)`, NVIDIA/TensorRT-LLM triton_backend/all_models/
inflight_batcher_llm/preprocessing/1/model.py, which our preprocessing.pbtxt runs with
add_special_tokens "true": whatever the post-processor adds, Llama's BOS say); a rendered chat
prompt without them, as transformers' apply_chat_template(tokenize=True) encodes it, so the
template's BOS is the only one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where a tokenizer is loaded: the router's waker (llm_operator/waker/)
    # runs this package's HTTP layer (http1.py, which imports protocol, sampling and this module)
    # from the operator's image, which has no tokenizers library.
    import tokenizers
    from tokenizers import processors

__all__ = ["Tokenizer", "TokenizerError", "read_json_object"]

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
# transformers >= 4.43 saves a single template beside the config; it takes priority over the config's.
CHAT_TEMPLATE_FILE = "chat_template.jinja"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
# Classes whose fast tokenizer rebuilds its post-processor from add_bos_token / add_eos_token at load
# (transformers v4.57.1, LlamaTokenizerFast.update_post_processor, copied by Gemma's), with their
# defaults; every other class keeps tokenizer.json's post-processor.
_BOS_EOS_FROM_CONFIG = {
    f"{name}{fast}": (True, False)
    for name in ("LlamaTokenizer", "CodeLlamaTokenizer", "GemmaTokenizer")
    for fast in ("", "Fast")
}


class TokenizerError(ValueError):
    """A tokenizer directory that cannot be used; the message names the file and what is wrong."""


def read_json_object(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise TokenizerError(f"cannot read {path}: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenizerError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise TokenizerError(f"{path} must hold a JSON object")
    return data


def _token(value: Any, where: Path, key: str) -> str:
    """A special token as tokenizer_config.json writes it: a string, an AddedToken object
    ({"__type": "AddedToken", "content": ...}) or null."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    raise TokenizerError(f"{where}: {key} must be a string, an AddedToken object or null")


def _chat_template(value: Any, where: Path) -> str | None:
    """tokenizer_config.json's chat_template: one template, or a list of named ones of which
    apply_chat_template uses "default"."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)
        for t in value
    ):
        named = {t["name"]: t["template"] for t in value}
        if "default" not in named:
            raise TokenizerError(
                f'{where}: chat_template names templates {sorted(named)} but none is "default", '
                "the one chat completions use"
            )
        return str(named["default"])
    raise TokenizerError(f"{where}: chat_template must be a string or a list of {{name, template}} objects")


@dataclass(frozen=True)
class Tokenizer:
    directory: Path
    chat_template: str | None  # None: the model has none (chat completions cannot be served)
    bos_token: str  # "" where the tokenizer has none, as render_chat takes it
    eos_token: str
    backend: tokenizers.Tokenizer
    end_id: int | None = None  # eos_token's id: the engine's end_id, as preprocessing derives it

    @classmethod
    def load(cls, directory: str | Path) -> Tokenizer:
        directory = Path(directory)
        path = directory / TOKENIZER_JSON
        if not path.is_file():
            raise TokenizerError(f"{path} is missing: the model's tokenizer directory needs a fast tokenizer")
        import tokenizers

        try:
            backend = tokenizers.Tokenizer.from_file(str(path))
        except Exception as e:  # the Rust side raises a bare Exception with serde's message
            raise TokenizerError(f"{path} is not a tokenizer the tokenizers library can read ({e})") from None

        config_path = directory / TOKENIZER_CONFIG
        config = read_json_object(config_path) if config_path.is_file() else {}
        template = _chat_template(config.get("chat_template"), config_path)
        if (directory / CHAT_TEMPLATE_FILE).is_file():
            try:
                template = (directory / CHAT_TEMPLATE_FILE).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise TokenizerError(f"cannot read {directory / CHAT_TEMPLATE_FILE} ({e})") from None
        tokens = {key: config.get(key) for key in ("bos_token", "eos_token")}
        source = config_path
        # Legacy directories (a config without added_tokens_decoder): special_tokens_map.json wins.
        if "added_tokens_decoder" not in config and (directory / SPECIAL_TOKENS_MAP).is_file():
            source = directory / SPECIAL_TOKENS_MAP
            tokens.update({k: v for k, v in read_json_object(source).items() if k in tokens})
        bos, eos = (_token(tokens[key], source, key) for key in ("bos_token", "eos_token"))

        defaults = _BOS_EOS_FROM_CONFIG.get(str(config.get("tokenizer_class")))
        if defaults is not None:
            add_bos = bool(config.get("add_bos_token", defaults[0]))
            add_eos = bool(config.get("add_eos_token", defaults[1]))
            backend.post_processor = _bos_eos_processor(
                backend, bos if add_bos else "", eos if add_eos else "", source
            )
        return cls(directory, template, bos, eos, backend, backend.token_to_id(eos) if eos else None)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        # encode_batch, not encode: the same ids, as fast, and it lets go of the GIL while it works
        # (tokenizers 0.22's binding), so the server's event loop goes on while a worker thread
        # encodes a long prompt (server.py); encode held it for the whole prompt.
        (encoding,) = self.backend.encode_batch([text], add_special_tokens=add_special_tokens)
        return list(encoding.ids)

    def prompt_ids(self, prompt: str, *, chat: bool) -> list[int]:
        """The ids the engine gets: a rendered chat prompt as apply_chat_template(tokenize=True)
        encodes it (no special tokens added: a template that writes BOS has the only one), a
        completion's as preprocessing does (with them)."""
        return self.encode(prompt, add_special_tokens=not chat)

    def chat_prompt(self, rendered: str) -> str:
        """The text to send for a rendered chat prompt on the LLM API contract, where the engine
        tokenizes. The engine encodes it adding the special tokens (the LLM API's default), so a
        template that writes BOS itself (Llama 2 and 3, Mistral, Gemma) would give two. Its BOS
        text is dropped where the engine's ids are then exactly what apply_chat_template(tokenize=
        True) makes; kept where they would differ (a SentencePiece tokenizer that marks only the
        text's first word changes that word), which only sending token ids can fix."""
        if not self.bos_token or not rendered.startswith(self.bos_token):
            return rendered
        without = rendered[len(self.bos_token) :]
        return (
            without if self.encode(without) == self.encode(rendered, add_special_tokens=False) else rendered
        )

    def special_ids(self, texts: list[str]) -> dict[int, str]:
        """The ids of those texts that are special tokens (decoding skips them), with their text."""
        special = {t.content: i for i, t in self.backend.get_added_tokens_decoder().items() if t.special}
        return {special[t]: t for t in texts if t in special}

    def count(self, text: str, *, add_special_tokens: bool = True) -> int:
        """How many tokens the engine receives for `text` (the prompt's share of maxInputLen)."""
        return len(self.encode(text, add_special_tokens=add_special_tokens))


def _bos_eos_processor(
    backend: tokenizers.Tokenizer, bos: str, eos: str, where: Path
) -> processors.TemplateProcessing:
    """As transformers' update_post_processor: `bos $A eos`, each present where it is added."""
    from tokenizers import processors

    special = [(t, backend.token_to_id(t)) for t in (bos, eos) if t]
    for token, token_id in special:
        if token_id is None:
            raise TokenizerError(f"{where}: the special token {token!r} is not in the tokenizer's vocabulary")
    single = " ".join([*([f"{bos}:0"] if bos else []), "$A:0", *([f"{eos}:0"] if eos else [])])
    pair = " ".join([single, *([f"{bos}:1"] if bos else []), "$B:1", *([f"{eos}:1"] if eos else [])])
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)
