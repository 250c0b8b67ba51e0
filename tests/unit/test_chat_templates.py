"""Issue 23's proof that the front door templates chat exactly as Hugging Face does: real models'
chat templates (tests/unit/upstream/chat_templates.json, each with the repository it was read from)
rendered through llm_operator.frontdoor.chat and through transformers' own apply_chat_template
(the version requirements/dev.lock pins), byte for byte, and refused by both for the same inputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2
import pytest
from llm_operator.frontdoor.chat import ChatTemplateError, render_chat
from llm_operator.runtime.cpu_reference import tokenizer_files
from transformers import PreTrainedTokenizerFast

DATA = json.loads((Path(__file__).parent / "upstream" / "chat_templates.json").read_text())
TEMPLATES = {t["name"]: t for t in DATA["templates"]}

SYSTEM = {"role": "system", "content": "You are terse. Answer in one line."}
CONVERSATIONS: dict[str, list[dict[str, Any]]] = {
    "one user turn": [{"role": "user", "content": "Hello"}],
    "system and user": [SYSTEM, {"role": "user", "content": "What is 2 + 2?"}],
    "several turns, padding and non-ASCII": [
        {"role": "user", "content": "  Grüß dich, wie geht's? 日本語 🙂 "},
        {"role": "assistant", "content": "   I am an assistant   "},
        {"role": "user", "content": 'Quote "this" & <that> {{ not a template }}\n\nwith\ttabs'},
    ],
    "system and several turns": [
        SYSTEM,
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
    ],
    # Inputs some templates refuse (raise_exception) or fail on: both renderers must agree.
    "two user turns in a row": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    "starts with the assistant": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}],
    "an unknown role": [{"role": "user", "content": "a"}, {"role": "critic", "content": "b"}],
    "content parts instead of a string": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    "no messages": [],
}


def transformers_render(entry: dict[str, Any], messages: list[dict[str, Any]], **kwargs: Any) -> str:
    """transformers' apply_chat_template with the model's special tokens; any tokenizer serves,
    since tokenize=False renders text only."""
    hf = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer_files.tokenizer(),
        bos_token=entry["bos_token"] or None,
        eos_token=entry["eos_token"] or None,
    )
    out = hf.apply_chat_template(messages, chat_template=entry["template"], tokenize=False, **kwargs)
    assert isinstance(out, str)
    return out


def both(entry: dict[str, Any], messages: list[dict[str, Any]], **kwargs: Any) -> tuple[Any, Any]:
    """(transformers' prompt or exception, ours or ChatTemplateError)."""
    try:
        theirs: Any = transformers_render(entry, messages, **kwargs)
    except Exception as e:
        theirs = e
    try:
        ours: Any = render_chat(
            entry["template"], messages, bos_token=entry["bos_token"], eos_token=entry["eos_token"], **kwargs
        )
    except ChatTemplateError as e:
        ours = e
    return theirs, ours


def test_the_data_covers_several_families_and_names_its_sources() -> None:
    assert {"llama-3", "qwen2.5", "mixtral", "gemma", "llama-2"} <= set(TEMPLATES)
    for entry in DATA["templates"]:
        assert entry["model"].startswith("https://huggingface.co/"), entry["name"]
        assert {"repository", "path", "commit"} <= set(entry["found_in"]), entry["name"]


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_renders_byte_identical_to_transformers_or_refuses_as_it_does(
    name: str, conversation: str, add_generation_prompt: bool
) -> None:
    theirs, ours = both(
        TEMPLATES[name], CONVERSATIONS[conversation], add_generation_prompt=add_generation_prompt
    )
    if isinstance(theirs, Exception):
        assert isinstance(ours, ChatTemplateError), f"transformers raised {theirs!r}; we rendered {ours!r}"
        if CONVERSATIONS[conversation]:  # (transformers fails on [] before templating: IndexError)
            assert str(theirs) in ours.message, "the client learns what transformers would say"
    else:
        assert isinstance(ours, str), f"transformers rendered {theirs!r}; we raised {ours!r}"
        assert ours.encode() == theirs.encode()


@pytest.mark.parametrize(
    ("name", "conversation", "why"),
    [
        ("gemma", "system and user", "System role not supported"),
        ("gemma", "two user turns in a row", "Conversation roles must alternate"),
        ("mixtral", "an unknown role", "Only user and assistant roles are supported!"),
        ("mixtral", "starts with the assistant", "Conversation roles must alternate"),
        ("llama-2", "two user turns in a row", "Conversation roles must alternate"),
    ],
)
def test_a_template_that_refuses_the_messages_says_why(name: str, conversation: str, why: str) -> None:
    """The refusals above are real (the comparison cannot pass by both rendering nothing), and the
    client learns the template's reason."""
    theirs, ours = both(TEMPLATES[name], CONVERSATIONS[conversation], add_generation_prompt=True)
    assert isinstance(theirs, jinja2.TemplateError)
    assert why in str(theirs)
    assert isinstance(ours, ChatTemplateError)
    assert ours.message.startswith("the model's chat template refused these messages: ")
    assert why in ours.message
    assert TEMPLATES[name]["template"] not in ours.message


def test_the_common_conversations_render_on_every_template() -> None:
    """Most of the matrix must be renders, not matching failures."""
    for entry in DATA["templates"]:
        messages = CONVERSATIONS["several turns, padding and non-ASCII"]
        prompt = render_chat(
            entry["template"], messages, bos_token=entry["bos_token"], eos_token=entry["eos_token"]
        )
        assert "日本語 🙂" in prompt and "<that> {{ not a template }}" in prompt, entry["name"]


def test_tools_and_tool_calls_render_as_transformers_renders_them() -> None:
    """Qwen 2.5's tool branch: `tools` reaches the template and transformers' tojson (no HTML
    escaping, non-ASCII kept) formats it and the call arguments."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather in a city <today> & tomorrow",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Wetter in Köln?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Köln"}}}
            ],
        },
        {"role": "tool", "content": '{"temp": 21}'},
    ]
    theirs, ours = both(TEMPLATES["qwen2.5"], messages, tools=tools, add_generation_prompt=True)
    assert isinstance(theirs, str)
    assert ours == theirs
    assert '"city": "Köln"' in ours and "<today> & tomorrow" in ours
