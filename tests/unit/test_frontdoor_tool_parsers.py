"""The tool-call parsers (frontdoor/tools/parsers.py, pure): each family's calls and content read out
of canned model text, text that only looks like a call kept as content, and the same calls however
the text is split into streamed pieces (hypothesis: split points anywhere)."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llm_operator.frontdoor.tools import parsers as TP

Parsed = tuple[str, list[tuple[str, str]]]

WEATHER = '{"city": "Paris", "unit": "c", "note": "a}\\"]b {x"}'
CANNED: dict[str, list[tuple[str, Parsed]]] = {
    "hermes": [
        (
            f'Let me check.\n\n<tool_call>\n{{"name": "get_weather", "arguments": {WEATHER}}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
            ("Let me check.", [("get_weather", WEATHER), ("get_time", "{}")]),
        ),
        (
            '<tool_call>{"name":"f","arguments":{"a":[1,{"b":2}]}}</tool_call>',
            ("", [("f", '{"a":[1,{"b":2}]}')]),
        ),
        # No closing tag before the next call, text after the last one.
        (
            '<tool_call>{"name": "f", "arguments": {}}\n<tool_call>{"name": "g", "arguments": {"x": 1}}'
            "</tool_call>\nDone.",
            ("\nDone.", [("f", "{}"), ("g", '{"x": 1}')]),
        ),
        # Looks like a call, is not: another key first, a name no function has, no marker.
        ('<tool_call>{"answer": 1}</tool_call> ok', ('<tool_call>{"answer": 1}</tool_call> ok', [])),
        (
            'a <tool_call>{"name": "no spaces", "arguments": {}}</tool_call>',
            ('a <tool_call>{"name": "no spaces", "arguments": {}}</tool_call>', []),
        ),
        ("plain <tool_ text  \n", ("plain <tool_ text  \n", [])),
        ("<tool_call>", ("<tool_call>", [])),
        # Cut short by max_tokens: the call as far as it went.
        ('<tool_call>{"name": "f", "arguments": {"a": "tru', ("", [("f", '{"a": "tru')])),
    ],
    "llama3-json": [
        (
            '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": {"y": [1, 2]}}',
            ("", [("a", '{"x": 1}'), ("b", '{"y": [1, 2]}')]),
        ),
        ('\n{"name": "get_weather", "parameters": ' + WEATHER + "}", ("", [("get_weather", WEATHER)])),
        ('{"answer": 1}', ('{"answer": 1}', [])),
        ('Hello {"name": "a", "parameters": {}}', ('Hello {"name": "a", "parameters": {}}', [])),
        ('{"name": "a", "parameters": {}} and more', (" and more", [("a", "{}")])),
        ("<|python_tag|>brave_search.call(query=1)", ("<|python_tag|>brave_search.call(query=1)", [])),
    ],
    "mistral": [
        (
            'ok [TOOL_CALLS] [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}] done',
            ("ok done", [("a", '{"x": 1}'), ("b", "{}")]),
        ),
        (
            '[TOOL_CALLS][{"name": "get_weather", "arguments": ' + WEATHER + "}]",
            ("", [("get_weather", WEATHER)]),
        ),
        ("[TOOL_CALLS] nothing", ("[TOOL_CALLS] nothing", [])),
        ("[TOOL", ("[TOOL", [])),
    ],
    "required": [
        (
            '[{"name": "a", "parameters": {"x": 1}}, {"name": "b", "parameters": {}}]',
            ("", [("a", '{"x": 1}'), ("b", "{}")]),
        ),
        ('[{"name":"f","parameters":' + WEATHER + "}]", ("", [("f", WEATHER)])),
    ],
}
CASES = [(family, text, want) for family, cases in CANNED.items() for text, want in cases]


def parse(family: str, pieces: list[str], tool: str = "") -> tuple[Parsed, list[TP.Event]]:
    parser = TP.ToolParser(family, tool)
    events = [e for piece in pieces for e in parser.feed(piece)] + parser.flush()
    calls = [(c.name, a) for c, a in zip(parser.calls, parser.arguments, strict=True)]
    return (parser.content, calls), events


@pytest.mark.parametrize(("family", "text", "want"), CASES)
def test_whole_text(family: str, text: str, want: Parsed) -> None:
    assert parse(family, [text])[0] == want


@pytest.mark.parametrize(("family", "text", "want"), CASES)
def test_split_at_every_character(family: str, text: str, want: Parsed) -> None:
    assert parse(family, list(text))[0] == want


@settings(max_examples=60, deadline=None)
@given(case=st.sampled_from(CASES), cuts=st.lists(st.integers(0, 400), max_size=12))
def test_streamed_and_whole_give_the_same_calls(case: tuple[str, str, Parsed], cuts: list[int]) -> None:
    family, text, want = case
    points = sorted({c % (len(text) + 1) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    assert parse(family, pieces)[0] == want


# Pieces of every format's structure and single characters, put together at random.
PARTS = ["<tool_call>", "</tool_call>", '{"name": "f", "arguments": ', '{"name":"g","parameters":',
         "[TOOL_CALLS]", "<|python_tag|>", '"x\\"}"', ": ", ", ", "; ", *'<>[]{}":,; \n_tlcaTOLnm|\\'
         ]  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(family=st.sampled_from(sorted(CANNED)), parts=st.lists(st.sampled_from(PARTS), max_size=30),
       cuts=st.lists(st.integers(0, 400), max_size=6))  # fmt: skip
def test_any_text_parses_the_same_split_or_whole_and_loses_no_content(
    family: str, parts: list[str], cuts: list[int]
) -> None:
    text = "".join(parts)
    points = sorted({c % (len(text) + 1) for c in cuts})
    whole, _ = parse(family, [text])
    split, _ = parse(family, [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)])
    assert split == whole
    if not whole[1]:
        assert whole[0] == text, "no call: every character is content"


def test_events_stream_as_openai_does_name_first_then_argument_fragments() -> None:
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    _, events = parse("hermes", [text[i : i + 3] for i in range(0, len(text), 3)])
    start, *fragments = events
    assert isinstance(start, TP.Start) and start.name == "get_weather" and start.index == 0
    assert re.fullmatch(r"call_[0-9a-f]{24}", start.id)
    assert all(isinstance(f, TP.Arguments) and f.index == 0 for f in fragments) and len(fragments) > 3
    assert json.loads("".join(f.text for f in fragments if isinstance(f, TP.Arguments))) == {"city": "Paris"}


def test_mistral_ids_are_nine_letters_and_digits() -> None:
    _, events = parse("mistral", ['[TOOL_CALLS][{"name": "a", "arguments": {}}]'])
    assert isinstance(events[0], TP.Start) and re.fullmatch(r"[A-Za-z0-9]{9}", events[0].id)


def test_a_named_tool_choices_text_is_that_calls_arguments() -> None:
    (content, calls), events = parse("named", ['{"ci', 'ty": 1}'], tool="get_weather")
    assert (content, calls) == ("", [("get_weather", '{"city": 1}')])
    assert [type(e) for e in events] == [TP.Start, TP.Arguments, TP.Arguments]
    assert parse("named", [], tool="f")[0] == ("", [("f", "")]), "no text: the call still comes"


def test_a_head_too_long_to_be_a_call_is_content() -> None:
    text = "<tool_call>{" + " " * TP.MAX_HEAD + '"name": "f", "arguments": {}}'
    assert parse("hermes", [text])[0] == (text, [])
    assert parse("hermes", list(text))[0] == (text, [])
