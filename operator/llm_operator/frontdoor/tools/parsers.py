"""Tool calls read out of a model's text as it streams (pure): one machine for every format, fed the
text piece by piece. The whole answer is the same machine fed the whole text, so a streamed and an
unstreamed answer are the same calls: every decision depends on the text alone, never on where the
pieces split it (tests/unit/test_frontdoor_tools.py splits canned texts at random points).

The formats, as vLLM's parsers read them (vllm/entrypoints/openai/tool_parsers/):
- hermes (Qwen2.5, Qwen3, Hermes): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
  repeated, anywhere in the text;
- llama3-json (Llama 3.1+): at the start of the text, an optional `<|python_tag|>`, then
  `{"name": ..., "parameters" (or "arguments"): {...}}` objects joined by `;`;
- mistral: `[TOOL_CALLS]` then a JSON array of `{"name": ..., "arguments": {...}}`;
- required (tool_choice required, guided): the text is a JSON array of `{"name", "parameters"}`;
- named (a named tool_choice, guided): the text is the one call's arguments.

Text before a call streams as content; from a marker on, text is held until the call's name is
whole and its arguments object has begun (`{"name": "f", "arguments": {`), then the call starts
(its name) and its arguments stream as the model writes them, the raw text of that object. Text
that looks like a call and is not (another key first, a name no function could have, a head longer
than MAX_HEAD) is content again, marker and all. Whitespace between calls and after the last one
is dropped; an answer without calls keeps all of its text.
"""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass
from enum import Enum

MAX_HEAD = 512  # characters from a marker to the arguments' `{`: beyond, not a call
NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_-")  # OpenAI's function names
MAX_NAME = 64
WS = " \t\r\n"


def call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def mistral_id() -> str:
    """Mistral's templates take back only ids of 9 letters and digits (vLLM's MistralToolCall)."""
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))


@dataclass(frozen=True)
class Format:
    marker: str  # what starts a block of calls ("": nothing, the text starts with the call)
    opening: str  # between the marker and the first call's `{`
    keys: tuple[str, ...]  # the arguments' key
    separator: str  # between calls of one block ("": one call per block)
    close: str  # after a block's last call ("": none)
    anywhere: bool  # a marker mid-text starts calls; else calls lead the text, the marker optional


FORMATS = {
    "hermes": Format("<tool_call>", "", ("arguments",), "", "</tool_call>", anywhere=True),
    "llama3-json": Format("<|python_tag|>", "", ("parameters", "arguments"), ";", "", anywhere=False),
    "mistral": Format("[TOOL_CALLS]", "[", ("arguments",), ",", "]", anywhere=True),
    "required": Format("", "[", ("parameters",), ",", "]", anywhere=False),
}
PARSERS = ("hermes", "llama3-json", "mistral")  # spec.model.toolCallParser's values


@dataclass(frozen=True)
class Content:
    text: str


@dataclass(frozen=True)
class Start:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class Arguments:
    index: int
    text: str


Event = Content | Start | Arguments


class _State(Enum):
    START = 1  # before anything but whitespace (formats whose calls lead the text)
    CONTENT = 2  # text, markers looked for when the format has them anywhere
    HEAD = 3  # from a marker or separator to the arguments' `{`
    ARGS = 4  # inside the arguments object
    END = 5  # after the arguments: the call's `}`
    NEXT = 6  # after a call: a separator, the block's close, or something else


class _Need(Exception):
    """The text so far cannot decide: wait for more."""


class _Fail(Exception):
    """The text is not what was expected here."""


def _ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in WS:
        i += 1
    return i


def _literal(text: str, i: int, word: str) -> int:
    got = text[i : i + len(word)]
    if got == word:
        return i + len(word)
    if word.startswith(got):
        raise _Need
    raise _Fail


class ToolParser:
    """One choice's calls: feed() its text as it comes, flush() at its end; each returns events."""

    def __init__(self, name: str, tool: str = "") -> None:
        """name: a format of FORMATS, or "named" (the text is the arguments of `tool`)."""
        self.named, self.tool = name == "named", tool
        self.format = FORMATS.get(name, FORMATS["required"])
        self.new_id = mistral_id if name == "mistral" else call_id
        self.text = ""
        self.pos = 0  # where the text not yet decided starts
        self.state = _State.CONTENT if self.format.anywhere else _State.START
        self.calls: list[Start] = []
        self._started = 0  # calls started, events not yet recorded included
        self.arguments: list[str] = []
        self.content = ""  # all content events together
        self._fallback = self._resume = 0  # a head that fails: its text is content, then go on there
        self._first = True  # the head of a block's first call (the format's opening before it)
        self._depth, self._in_string, self._escape = 0, False, False

    def feed(self, piece: str) -> list[Event]:
        if self.named:
            return self._named(piece)
        self.text += piece
        events: list[Event] = []
        while self._step(events):
            pass
        return self._record(events)

    def flush(self) -> list[Event]:
        if self.named:
            return self._record([] if self._started else [self._start(self.tool)])
        events: list[Event] = []
        rest = self.text[self.pos :]
        if self.state in (_State.START, _State.CONTENT) and (rest.strip(WS) or not self._started):
            events.append(Content(rest))
        elif self.state == _State.HEAD:
            events.append(Content(self.text[self._fallback :]))
        elif self.state == _State.ARGS and rest:  # cut short (max_tokens): the call as far as it got
            events.append(Arguments(self._started - 1, rest))
        self.pos = len(self.text)
        return self._record(events)

    def _named(self, piece: str) -> list[Event]:
        events: list[Event] = []
        if not self._started and piece:
            events.append(self._start(self.tool))
        if piece:
            events.append(Arguments(0, piece))
        return self._record(events)

    def _start(self, name: str) -> Start:
        self._started += 1
        return Start(self._started - 1, self.new_id(), name)

    def _record(self, events: list[Event]) -> list[Event]:
        out: list[Event] = []
        for event in events:
            if isinstance(event, Content | Arguments) and not event.text:
                continue
            if isinstance(event, Content):
                self.content += event.text
            elif isinstance(event, Start):
                self.calls.append(event)
                self.arguments.append("")
            else:
                self.arguments[event.index] += event.text
            out.append(event)
        return out

    def _step(self, events: list[Event]) -> bool:
        """One decision, its events added; False when the text so far decides nothing more."""
        try:
            if self.state == _State.START:
                return self._leading()
            if self.state == _State.CONTENT:
                return self._content(events)
            if self.state == _State.HEAD:
                return self._head(events)
            if self.state == _State.ARGS:
                return self._args(events)
            if self.state == _State.END:
                self.pos = _literal(self.text, _ws(self.text, self.pos), "}")
                self.state = _State.NEXT
                return True
            return self._next()
        except _Need:
            return False
        except _Fail:
            self.state = _State.CONTENT  # what follows a call that is not its format: content
            return True

    def _leading(self) -> bool:
        i = _ws(self.text, self.pos)
        if i == len(self.text):
            return False
        marker, rest = self.format.marker, self.text[i:]
        if marker and len(rest) < len(marker) and marker.startswith(rest):
            return False
        self._fallback = self.pos
        self._resume = self.pos
        if marker and self.text.startswith(marker, i):
            self._resume = i + len(marker)
        self._go_head(self._resume, first=True)
        return True

    def _content(self, events: list[Event]) -> bool:
        marker = self.format.marker if self.format.anywhere else ""
        found = self.text.find(marker, self.pos) if marker else -1
        end = found if found >= 0 else len(self.text)
        if found < 0 and marker:  # hold a tail that may begin the marker
            end -= next((k for k in range(min(len(marker) - 1, end - self.pos), 0, -1)
                         if marker.startswith(self.text[end - k :])), 0)  # fmt: skip
        said = self.text[self.pos : end].rstrip(WS)  # whitespace waits: it may be all before a call
        events.append(Content(said))
        self.pos += len(said)
        if found < 0:
            return False
        self._fallback, self._resume = self.pos, found + len(marker)
        self._go_head(self._resume, first=True)
        return True

    def _go_head(self, at: int, *, first: bool) -> None:
        self.pos, self._first, self.state = at, first, _State.HEAD

    def _head(self, events: list[Event]) -> bool:
        text = self.text[: self.pos + MAX_HEAD]
        try:
            i = _ws(text, self.pos)
            if self._first and self.format.opening:
                i = _ws(text, _literal(text, i, self.format.opening))
            i = _ws(text, _literal(text, i, "{"))
            i = _ws(text, _literal(text, i, '"name"'))
            i = _ws(text, _literal(text, i, ":"))
            name, i = _name(text, i)
            i = _ws(text, _literal(text, _ws(text, i), ","))
            i = _ws(text, _literal(text, _ws(text, _key(text, i, self.format.keys)), ":"))
            i = _literal(text, _ws(text, i), "{")
        except _Need:
            if len(text) < len(self.text) or len(self.text) - self.pos >= MAX_HEAD:
                return self._not_a_call(events)
            raise
        except _Fail:
            return self._not_a_call(events)
        events.append(self._start(name))
        self.state, self.pos = _State.ARGS, i - 1
        self._depth, self._in_string, self._escape = 0, False, False
        return True

    def _not_a_call(self, events: list[Event]) -> bool:
        events.append(Content(self.text[self._fallback : self._resume]))
        self.pos, self.state = self._resume, _State.CONTENT
        return True

    def _args(self, events: list[Event]) -> bool:
        i, text = self.pos, self.text
        depth, in_string, escape = self._depth, self._in_string, self._escape
        while i < len(text):
            c = text[i]
            i += 1
            if in_string:
                escape, in_string = (False, True) if escape else (c == "\\", c != '"')
            elif c == '"':
                in_string = True
            elif c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    break
        events.append(Arguments(self._started - 1, text[self.pos : i]))
        self.pos, self._depth, self._in_string, self._escape = i, depth, in_string, escape
        if depth:
            return False
        self.state = _State.END
        return True

    def _next(self) -> bool:
        f = self.format
        i = _ws(self.text, self.pos)
        if i == len(self.text):
            raise _Need
        if f.separator and self.text.startswith(f.separator, i):
            self._fallback, self._resume = i, i + len(f.separator)
            self._go_head(self._resume, first=False)
            return True
        if f.close:
            self.pos = _literal(self.text, i, f.close)
        self.state = _State.CONTENT
        return True


def _name(text: str, i: int) -> tuple[str, int]:
    i = _literal(text, i, '"')
    j = i
    while j < len(text) and text[j] in NAME_CHARS and j - i < MAX_NAME:
        j += 1
    if j == len(text):
        raise _Need
    if text[j] != '"' or j == i:
        raise _Fail
    return text[i:j], j + 1


def _key(text: str, i: int, keys: tuple[str, ...]) -> int:
    for key in keys:
        try:
            return _literal(text, i, f'"{key}"')
        except _Fail:
            continue
    raise _Fail  # _Need from any key propagates: it may still be that one
