"""render_chat's environment, feature by feature, against transformers' apply_chat_template: the
Jinja2 settings and globals a template may rely on, and the errors a server turns into a 400."""

from __future__ import annotations

from typing import Any

import pytest
from jinja2.exceptions import SecurityError, TemplateSyntaxError
from llm_operator.frontdoor.chat import ChatTemplateError, render_chat
from llm_operator.runtime.cpu_reference import tokenizer_files
from transformers import PreTrainedTokenizerFast

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Ünïcödé <b>&</b> 'q'"},
    {"role": "assistant", "content": "ok"},
    {"role": "user", "content": "again"},
]


def transformers_render(
    template: str, messages: list[dict[str, Any]], bos: str, eos: str, **kwargs: Any
) -> str:
    hf = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer_files.tokenizer(), bos_token=bos or None, eos_token=eos or None
    )
    out = hf.apply_chat_template(messages, chat_template=template, tokenize=False, **kwargs)
    assert isinstance(out, str)
    return out


FEATURES = {
    # trim_blocks and lstrip_blocks: block tags leave no newline or indentation behind.
    "whitespace control": "{% for m in messages %}\n    {% if m.role == 'user' %}\n  U: {{ m.content }}\n"
    "    {% endif %}\n{% endfor %}\n",
    # The loopcontrols extension.
    "break and continue": "{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}{{ m.role }};"
    "{% if m.role == 'assistant' %}{% break %}{% endif %}{% endfor %}",
    # transformers' tojson: no HTML escaping, ensure_ascii off, its keyword arguments.
    "tojson": "{{ messages | tojson }}|{{ messages[1] | tojson(indent=2) }}"
    "|{{ messages[0] | tojson(sort_keys=true) }}|{{ messages[1] | tojson(ensure_ascii=true) }}",
    # The {% generation %} tag of templates that mark assistant turns.
    "generation blocks": "{% for m in messages %}{% if m.role == 'assistant' %}"
    "{% generation %}A:{{ m.content }}{% endgeneration %}{% else %}{{ m.role }}{% endif %}{% endfor %}",
    "strftime_now": "{{ strftime_now('%Y') }}",
    # Special tokens are defined only where the tokenizer sets them.
    "special tokens": "[{{ bos_token is defined }}|{{ eos_token is defined }}"
    "|{{ bos_token }}{{ eos_token }}]",
    "namespace and filters": "{% set ns = namespace(n=0) %}"
    "{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }} "
    "{{ messages[1].content | upper }} {{ messages | map(attribute='role') | join(',') }}",
    "add_generation_prompt": "{{ add_generation_prompt }}{% if add_generation_prompt %}<start>{% endif %}",
    "tools and documents default to none": "{{ tools is none }} {{ documents is none }}",
}


@pytest.mark.parametrize("feature", sorted(FEATURES))
@pytest.mark.parametrize(("bos", "eos"), [("<s>", "</s>"), ("", "<|im_end|>"), ("", "")])
def test_each_feature_renders_as_transformers_renders_it(feature: str, bos: str, eos: str) -> None:
    template = FEATURES[feature]
    theirs = transformers_render(template, MESSAGES, bos, eos, add_generation_prompt=True)
    assert render_chat(template, MESSAGES, bos_token=bos, eos_token=eos) == theirs


def test_extra_variables_reach_the_template_as_transformers_passes_them() -> None:
    template = "{{ enable_thinking }} {{ tools | length }} {{ documents[0].title }}"
    extra: dict[str, Any] = {
        "enable_thinking": False,
        "tools": [{"a": 1}],
        "documents": [{"title": "T", "text": "x"}],
    }
    theirs = transformers_render(template, MESSAGES, "", "", add_generation_prompt=False, **extra)
    assert render_chat(template, MESSAGES, add_generation_prompt=False, **extra) == theirs == "False 1 T"


def test_a_template_that_does_not_compile_is_one_sentence_without_its_source() -> None:
    template = "{% for m in messages %}{{ m.content }}{% endfor %}\n{% if secret_part %}{{ oops }"
    with pytest.raises(ChatTemplateError) as info:
        render_chat(template, MESSAGES)
    message = info.value.message
    assert message.startswith("the model's chat template is not valid Jinja2 (line 2: ")
    assert "secret_part" not in message and "\n" not in message


@pytest.mark.parametrize(
    "template", ["{% frobnicate %}", "{% do messages.pop() %}", "{% trans %}x{% endtrans %}"]
)
def test_tags_transformers_does_not_know_fail_to_compile_in_both(template: str) -> None:
    with pytest.raises(TemplateSyntaxError):
        transformers_render(template, MESSAGES, "", "")
    with pytest.raises(ChatTemplateError, match="not valid Jinja2"):
        render_chat(template, MESSAGES)


def test_the_sandbox_keeps_the_messages_immutable_and_python_out() -> None:
    with pytest.raises(ChatTemplateError, match="failed on these messages"):
        render_chat("{{ messages.append({'role': 'x'}) }}", MESSAGES)
    with pytest.raises(SecurityError):
        transformers_render("{{ messages.__class__.__mro__ }}", MESSAGES, "", "")
    with pytest.raises(ChatTemplateError, match="is unsafe"):
        render_chat("{{ messages.__class__.__mro__ }}", MESSAGES)


def test_a_template_failing_on_the_messages_names_the_failure() -> None:
    with pytest.raises(ChatTemplateError) as info:
        render_chat("{{ messages[0].content + 1 }}", MESSAGES)
    assert info.value.message.startswith("the model's chat template failed on these messages (TypeError: ")
    with pytest.raises(ChatTemplateError, match="has no attribute 'missing'"):
        render_chat("{{ messages[0].missing.deeper }}", MESSAGES)


def test_raise_exception_is_a_refusal_with_the_templates_reason() -> None:
    with pytest.raises(ChatTemplateError) as info:
        render_chat("{{ raise_exception('Only one system message, please.') }}", MESSAGES)
    assert (
        info.value.message
        == "the model's chat template refused these messages: Only one system message, please."
    )


def test_an_empty_chat_is_refused_as_transformers_refuses_it() -> None:
    with pytest.raises(IndexError):
        transformers_render("{{ 'x' }}", [], "", "")
    with pytest.raises(ChatTemplateError, match="at least one message"):
        render_chat("{{ 'x' }}", [])
