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
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, replace
from typing import Any

from tokenizers.decoders import DecodeStream

from llm_operator.frontdoor import http1 as H
from llm_operator.frontdoor import protocol as P
from llm_operator.frontdoor import responses as R
from llm_operator.frontdoor.tokenizer import Tokenizer
from llm_operator.frontdoor.upstream import Answer, UpstreamError

Usage = Callable[[list["Choice"]], dict[str, int]]


async def texts(
    answers: AsyncGenerator[Answer, None], tokenizer: Tokenizer, end_id: int | None
) -> AsyncGenerator[Answer, None]:
    """Each response's text (maybe "" while a character is incomplete) and each id's part of it,
    its ids kept; the response whose last id is `end_id` says "stop" (the engine ended the
    sequence itself). One DecodeStream per sequence (n > 1: the responses interleave)."""
    streams: dict[int, DecodeStream] = {}
    try:
        async for answer in answers:
            stream = streams.setdefault(answer.index, DecodeStream(skip_special_tokens=True))
            pieces = tuple(stream.step(tokenizer.backend, i) or "" for i in answer.ids)
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


class Choice:
    def __init__(self, index: int, stops: list[str]) -> None:
        self.index, self.stops = index, R.Stops(stops)
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


def finish(choice: Choice, gen: P.Generation) -> str:
    """ "stop": a stop sequence, or the model ended before max_tokens. The llmapi model says why
    itself (its finish_reason output, the LLM API's CompletionOutput.finish_reason), mapped to
    OpenAI's values by responses.finish_reason; on the engine contract its last id being the end
    id says "stop" (engine.py), else its ids are counted against max_tokens (fewer: "stop")."""
    if choice.stops.hit:
        return "stop"
    if choice.reason is not None:
        return R.finish_reason(choice.reason)
    return "length" if choice.count >= gen.max_tokens else "stop"


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
    choices = [Choice(i, gen.stop) for i in range(gen.extras.n)]
    piece = first
    while piece is not None:
        choice = _choice(choices, piece)
        if not choice.done:
            choice.feed(piece)
        if all(c.done for c in choices):
            break
        piece = await next_answer(pieces)
    for choice in choices:
        choice.flush()
    return choices


async def stream(peer: H.Peer, gen: P.Generation, first: Answer | None, pieces: AsyncGenerator[Answer, None],
                 usage: Usage, token: Callable[[int], str]) -> None:  # fmt: skip
    """The choices' chunks as their text comes, then each one's finish and the usage."""
    choices = [Choice(i, gen.stop) for i in range(gen.extras.n)]

    def so_far() -> dict[str, int] | None:
        return usage(choices) if gen.usage_every_chunk else None

    async def send(choice: Choice, text: str, entries: list[Entry]) -> None:
        if text or entries or not choice.started:
            await peer.event(R.chunk(gen, text, None, first=not choice.started, counts=so_far(),
                                     index=choice.index, logprobs=logprobs(gen, entries, token)))  # fmt: skip
            choice.started = True

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
        if tail or entries:
            await send(choice, tail, entries)
    counts = usage(choices)
    for choice in choices:
        await peer.event(R.chunk(gen, None, finish(choice, gen), counts=counts, index=choice.index))
    if gen.include_usage:
        await peer.event(R.usage_chunk(gen, counts))
