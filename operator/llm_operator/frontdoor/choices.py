"""An answer's choices, from the model's responses to OpenAI's streamed chunks or whole response.

The engine contract's text (texts): the `tensorrt_llm` model's output ids, decoded here, once per
sequence.

TensorRT-LLM's inflight_batcher_llm `tensorrt_llm` model answers with `output_ids` [batch, beam,
length] and `sequence_length` [batch, beam] (triton_backend/inflight_batcher_llm/src/
model_instance_state.cc, fillTritonResponse, stored copy c8c6df08). Streaming, each response
holds only the ids produced since the previous one (the executor's LlmRequest::createResult sends
`maxNbTokens - getMaxSentTokenLen()` of them unless returnAllGeneratedTokens, which it sets only
for beam search: cpp/tensorrt_llm/batch_manager/llmRequest.cpp, stored copy 89fd9b74); the last
response of a request carries Triton's final flag, which generate_stream shows as the end of the
event stream. Not streaming, the one response holds every generated id (exclude_input_in_output).

The stock postprocessing model decodes each response's ids on their own (`batch_decode` of that
response alone: triton_backend/all_models/inflight_batcher_llm/postprocessing/1/model.py, stored
copy 2e2327b9): SentencePiece's leading spaces vanish and a character split across tokens becomes
U+FFFD. Here one `DecodeStream` per sequence sees its every id in order, so the text streamed is the
text of all the ids together, whatever the pieces.

With n > 1 the engine's responses interleave, each naming its sequence (Answer.index): each choice
has its own DecodeStream, stop sequences, finish reason and count, its chunks go out as its
responses come (interleaved by index), and usage sums the choices' tokens (the prompt counted once).

Log probabilities ride with the text: a chunk carries the entries of the ids whose text it carries.
An id whose text DecodeStream holds back (part of a character) goes with the id that completes it;
text a stop sequence holds back keeps its ids' entries back too; a stop sequence's cut drops the
entries after it. Each entry is vLLM's: the id decoded alone, its UTF-8 bytes, its log-probability
(the engine's: the sampled token only, no alternatives).

Tool calls (tools/parsers.py) are read out of each choice's text after its stop sequences, the same
parser streaming or not: a chunk carries either content or one call's start or one fragment of its
arguments, as OpenAI's do; log-probability entries ride with the chunks their text is released in
before the parser, so a chunk of held text may carry none.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from tokenizers.decoders import DecodeStream

from llm_operator.frontdoor import http1 as H
from llm_operator.frontdoor import protocol as P
from llm_operator.frontdoor import responses as R
from llm_operator.frontdoor.tokenizer import Tokenizer
from llm_operator.frontdoor.tools import parsers as TP
from llm_operator.frontdoor.upstream import Answer, UpstreamError

Usage = Callable[[list["Choice"]], dict[str, int]]


async def texts(
    answers: AsyncGenerator[Answer, None], tokenizer: Tokenizer, end_id: int | None,
    keep: Mapping[int, str] | None = None,
) -> AsyncGenerator[Answer, None]:  # fmt: skip
    """Each response's text (maybe "" while a character is incomplete) and each id's part of it,
    its ids kept; the response whose last id is `end_id` says "stop" (the engine ended the
    sequence itself). One DecodeStream per sequence (n > 1: the responses interleave). Special
    tokens are skipped but those in `keep`, written as their text: a tool-call parser's markers."""
    streams: dict[int, DecodeStream] = {}
    kept = keep or {}
    try:
        async for answer in answers:
            stream = streams.setdefault(answer.index, DecodeStream(skip_special_tokens=True))
            pieces = tuple((stream.step(tokenizer.backend, i) or "") + kept.get(i, "") for i in answer.ids)
            ended = end_id is not None and bool(answer.ids) and answer.ids[-1] == end_id
            yield replace(
                answer, text="".join(pieces), finish_reason="stop" if ended else None, pieces=pieces
            )
    finally:
        await answers.aclose()


@dataclass(frozen=True)
class Entry:
    id: int
    logprob: float
    offset: int  # where its text starts in the choice's whole text
    chars: int  # the length of its text (0 while DecodeStream holds it back)


def parser(gen: P.Generation) -> TP.ToolParser | None:
    """A choice's tool-call parser (None: its text is the answer)."""
    return TP.ToolParser(gen.extras.parser, gen.extras.tool) if gen.extras.parser else None


class Choice:
    def __init__(self, index: int, stops: list[str], tools: TP.ToolParser | None = None) -> None:
        self.index, self.stops, self.tools = index, R.Stops(stops), tools
        self.text, self.count = "", 0
        self.reason: str | None = None
        self.started = self.done = False
        self.entries: list[Entry] = []  # released
        self._pending: list[Entry] = []
        self._seen = 0  # characters of the ids fed so far
        self._released = 0  # characters of the released entries

    def feed(self, answer: Answer) -> tuple[str, list[Entry]]:
        """The text that may be sent now and the entries that go with it."""
        self.count += len(answer.ids)
        self.reason = answer.finish_reason or self.reason
        pieces = answer.pieces or ("",) * len(answer.ids)
        for id_, logprob, piece in zip(answer.ids, answer.log_probs, pieces, strict=False):
            self._pending.append(Entry(id_, logprob, self._seen, len(piece)))
            self._seen += len(piece)
        out = self.stops.feed(answer.text)
        self.text += out
        self.done = self.stops.hit
        return out, self._release()

    def flush(self) -> tuple[str, list[Entry]]:
        """At the end: the text stop sequences held, and the entries left (all of them, the end
        token's included, unless a stop sequence cut the text)."""
        tail = self.stops.flush()
        self.text += tail
        entries = self._release()
        if not self.stops.hit:
            entries += self._pending
            self.entries += self._pending
        self._pending = []
        return tail, entries

    def _release(self) -> list[Entry]:
        out: list[Entry] = []
        group: list[Entry] = []
        end = self._released
        for entry in self._pending:
            group.append(entry)
            end += entry.chars
            if not entry.chars:
                continue  # held back: it goes with the id that completes its text
            if end > len(self.text):
                break
            out += group
            group, self._released = [], end
        self._pending = self._pending[len(out) :]
        self.entries += out
        return out


def logprobs(gen: P.Generation, entries: list[Entry], token: Callable[[int], str]) -> dict[str, Any] | None:
    """The choice's `logprobs` for these entries (None: not asked for)."""
    if not gen.extras.logprobs:
        return None
    texts = [token(e.id) for e in entries]
    if gen.kind == "chat":
        content = [{"token": t, "logprob": e.logprob, "bytes": list(t.encode()), "top_logprobs": []}
                   for t, e in zip(texts, entries, strict=True)]  # fmt: skip
        return {"content": content}
    return {"tokens": texts, "token_logprobs": [e.logprob for e in entries], "top_logprobs": None,
            "text_offset": [e.offset for e in entries]}  # fmt: skip


def tool_calls(choice: Choice) -> list[dict[str, Any]]:
    """The choice's whole calls, as a response's message carries them."""
    if choice.tools is None:
        return []
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": a}}
            for c, a in zip(choice.tools.calls, choice.tools.arguments, strict=True)]  # fmt: skip


def _delta(event: TP.Event) -> tuple[str | None, list[dict[str, Any]] | None]:
    """A parser's event as a chunk's (content, tool_calls)."""
    if isinstance(event, TP.Content):
        return event.text, None
    if isinstance(event, TP.Start):
        function = {"name": event.name, "arguments": ""}
        return None, [{"index": event.index, "id": event.id, "type": "function", "function": function}]
    return None, [{"index": event.index, "function": {"arguments": event.text}}]


def finish(choice: Choice, gen: P.Generation) -> str:
    """ "stop": a stop sequence, or the model ended before max_tokens. The llmapi model says why
    itself (its finish_reason output, the LLM API's CompletionOutput.finish_reason), mapped to
    OpenAI's values by responses.finish_reason; on the engine contract its last id being the end
    id says "stop" (engine.py), else its ids are counted against max_tokens (fewer: "stop")."""
    if choice.stops.hit:
        reason = "stop"
    elif choice.reason is not None:
        reason = R.finish_reason(choice.reason)
    else:
        reason = "length" if choice.count >= gen.max_tokens else "stop"
    # Calls the model chose to make (a named tool_choice's is the answer asked for: "stop", as OpenAI).
    called = choice.tools is not None and choice.tools.calls and not choice.tools.named
    return "tool_calls" if called and reason == "stop" else reason


async def next_answer(pieces: AsyncGenerator[Answer, None]) -> Answer | None:
    try:
        return await anext(pieces)
    except StopAsyncIteration:
        return None


def _choice(choices: list[Choice], answer: Answer) -> Choice:
    if not 0 <= answer.index < len(choices):
        raise UpstreamError(502, f"the model server sent sequence_index {answer.index} of {len(choices)}")
    return choices[answer.index]


async def whole(
    gen: P.Generation, first: Answer | None, pieces: AsyncGenerator[Answer, None]
) -> list[Choice]:
    """The choices, read to their ends."""
    choices = [Choice(i, gen.stop, parser(gen)) for i in range(gen.extras.n)]
    piece = first
    while piece is not None:
        choice = _choice(choices, piece)
        if not choice.done:
            text, _ = choice.feed(piece)
            if choice.tools is not None:
                choice.tools.feed(text)
        if all(c.done for c in choices):
            break
        piece = await next_answer(pieces)
    for choice in choices:
        tail, _ = choice.flush()
        if choice.tools is not None:
            choice.tools.feed(tail)
            choice.tools.flush()
    return choices


async def stream(peer: H.Peer, gen: P.Generation, first: Answer | None, pieces: AsyncGenerator[Answer, None],
                 usage: Usage, token: Callable[[int], str]) -> None:  # fmt: skip
    """The choices' chunks as their text comes, then each one's finish and the usage."""
    choices = [Choice(i, gen.stop, parser(gen)) for i in range(gen.extras.n)]

    def so_far() -> dict[str, int] | None:
        return usage(choices) if gen.usage_every_chunk else None

    async def send(choice: Choice, text: str, entries: list[Entry], end: bool = False) -> None:
        deltas: list[tuple[str | None, list[dict[str, Any]] | None]] = [(text, None)]
        if choice.tools is not None:
            events = choice.tools.feed(text) + (choice.tools.flush() if end else [])
            deltas = [_delta(e) for e in events] or [(None, None)]
        for content, calls in deltas:
            if content or calls or entries or not choice.started:
                await peer.event(R.chunk(gen, content, None, first=not choice.started, counts=so_far(),
                                         index=choice.index, logprobs=logprobs(gen, entries, token),
                                         tool_calls=calls))  # fmt: skip
                choice.started, entries = True, []

    piece = first
    while piece is not None:
        choice = _choice(choices, piece)
        if not choice.done:
            await send(choice, *choice.feed(piece))
        if all(c.done for c in choices):
            break  # every choice hit a stop sequence: closing the stream cancels the request
        piece = await next_answer(pieces)
    for choice in choices:
        tail, entries = choice.flush()
        if tail or entries or choice.tools is not None:
            await send(choice, tail, entries, end=True)
    counts = usage(choices)
    for choice in choices:
        await peer.event(R.chunk(gen, None, finish(choice, gen), counts=counts, index=choice.index))
    if gen.include_usage:
        await peer.event(R.usage_chunk(gen, counts))
