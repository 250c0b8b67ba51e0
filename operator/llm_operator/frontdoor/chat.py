"""Chat messages -> one prompt, through the model's own chat template, rendered exactly as Hugging
Face transformers' `apply_chat_template(messages, tokenize=False)` renders it.

The Jinja2 environment is transformers' own (v4.57.1, transformers/utils/chat_template_utils.py,
`_compile_jinja_template` and `render_jinja_template`): sandboxed and immutable, trim_blocks and
lstrip_blocks, loop controls, the `{% generation %}` tag, the `raise_exception` and `strftime_now`
globals and transformers' `tojson` (no HTML escaping, its own argument order). The context is the
same too: `messages`, `tools` and `documents` (None unless given), `add_generation_prompt`, and the
tokenizer's special tokens only where they are set. tests/unit/test_chat_templates.py renders real
models' templates through both and compares the bytes.

Standard library and jinja2 only: the front door runs in NVIDIA's images and the cpu-runtime image,
neither of which has to carry transformers.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["ChatTemplateError", "render_chat"]


class ChatTemplateError(Exception):
    """The chat template cannot be compiled, or it refused or failed on these messages. The message
    is one sentence for a client or an operator; it never quotes the template's source."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _Refusal(jinja2.TemplateError):
    """What `raise_exception(...)` raises: the template's own verdict on the messages."""


def _raise_exception(message: str) -> None:
    raise _Refusal(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # transformers replaces Jinja's filter (which escapes <, >, & and ') with plain json.dumps,
    # keeping its positional order: `x | tojson(4)` sets ensure_ascii there too.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks the assistant's part of a conversation.
    transformers records where it lies only for return_assistant_tokens_mask; rendered as text,
    the block is its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


@functools.lru_cache(maxsize=32)
def _compile(template: str) -> jinja2.Template:
    """One compiled template per distinct source (a server sees one or two): compiling costs
    milliseconds, rendering a compiled one microseconds."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(
            f"the model's chat template is not valid Jinja2 (line {e.lineno}: {e.message})"
        ) from None


def render_chat(
    template: str,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    **extra: Any,
) -> str:
    """The prompt `template` makes of `messages`. `extra` reaches the template as variables, as
    apply_chat_template's keyword arguments do (tools=[...], documents=[...], enable_thinking=...).

    Raises ChatTemplateError when the template does not compile, when it rejects the messages
    (`raise_exception`), or when it fails on them (a missing key, a type it cannot add)."""
    if not messages:  # transformers fails on an empty conversation before it renders anything
        raise ChatTemplateError("a chat needs at least one message")
    compiled = _compile(template)
    # As transformers' special_tokens_map: a token that is not set is not defined at all.
    tokens = {name: value for name, value in (("bos_token", bos_token), ("eos_token", eos_token)) if value}
    context = {"tools": None, "documents": None, **tokens, **extra}
    try:
        return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt, **context)
    except _Refusal as e:
        raise ChatTemplateError(f"the model's chat template refused these messages: {e.message}") from None
    except jinja2.TemplateError as e:  # undefined names, sandbox violations
        why = e.message or type(e).__name__
        raise ChatTemplateError(f"the model's chat template failed on these messages: {why}") from None
    except Exception as e:  # the template is the model's code: str + list, a bad index...
        raise ChatTemplateError(
            f"the model's chat template failed on these messages ({type(e).__name__}: {e})"
        ) from None
