"""The OpenAI API's responses (pure): whole answers, streamed chunks, usage, the model list, and
stop sequences cut out of streamed text. Requests and their translation are protocol.py's."""

from __future__ import annotations

from typing import Any

from llm_operator.frontdoor.protocol import ApiError, Generation


class Stops:
    """OpenAI's stop sequences on streamed text: text is released as soon as it cannot be the start
    of a stop sequence, and the output ends before the first stop sequence (excluded)."""

    def __init__(self, stops: list[str]) -> None:
        self.stops, self.held, self.hit = stops, "", False
        self.longest = max((len(s) for s in stops), default=0)

    def feed(self, piece: str) -> str:
        """The text that may be sent now."""
        if not self.stops:
            return piece
        text = self.held + piece
        found = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if found:
            self.hit, self.held = True, ""
            return text[: min(found)]
        keep = 0  # the longest tail of text that begins some stop sequence
        for n in range(min(self.longest - 1, len(text)), 0, -1):
            if any(s.startswith(text[-n:]) for s in self.stops):
                keep = n
                break
        self.held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def flush(self) -> str:
        held, self.held = self.held, ""
        return held


# The LLM API's finish reasons (NVIDIA/TensorRT-LLM tensorrt_llm/executor/result.py,
# CompletionOutput.finish_reason: Literal['stop', 'length', 'timeout', 'cancelled']) in OpenAI's
# terms, whose clients know stop, length, tool_calls and content_filter only. trtllm-serve passes
# the LLM API's value on as it is (tensorrt_llm/serve/postprocess_handlers.py), and vLLM its
# "abort" (vllm-project/vllm#57082): a client then reads an ended stream as a complete answer.
# A timeout is the engine's time budget ending the output early: `length`, the value that tells a
# client its answer was cut short. A cancellation the client did not ask for (the engine or
# Triton ended the request) is not an answer: an error, as vLLM answers its "error" reason.
OPENAI_FINISH = {"stop": "stop", "length": "length", "timeout": "length"}


def finish_reason(engine: str) -> str:
    """OpenAI's finish_reason for the engine's, or the ApiError that ends the response instead."""
    if engine in OPENAI_FINISH:
        return OPENAI_FINISH[engine]
    if engine == "cancelled":
        raise ApiError(503, "the model cancelled this generation before it ended; retry",
                       kind="server_error", code="generation_cancelled")  # fmt: skip
    raise ApiError(500, f"the model ended this generation with finish_reason {engine!r}, which the "
                   "front door does not know", kind="server_error")  # fmt: skip


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}  # fmt: skip


Whole = tuple[str, str, dict[str, Any] | None, list[dict[str, Any]]]


def response(gen: Generation, choices: list[Whole], counts: dict[str, int]) -> dict[str, Any]:
    """The whole answer: each choice's (text, finish_reason, logprobs, tool calls), by index. With
    tool calls, a message without other text has content null, as OpenAI's."""
    out: list[dict[str, Any]] = []
    for index, (text, finish, logprobs, calls) in enumerate(choices):
        if gen.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else text)}
            if calls:
                message["tool_calls"] = calls
            out.append({"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish})
        else:
            out.append({"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish})
    obj = "chat.completion" if gen.kind == "chat" else "text_completion"
    return {"id": gen.response_id, "object": obj, "created": gen.created, "model": gen.model,
            "choices": out, "usage": counts}  # fmt: skip


def chunk(
    gen: Generation, text: str | None, finish: str | None, *, first: bool = False,
    counts: dict[str, int] | None = None, index: int = 0, logprobs: dict[str, Any] | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One streamed event of choice `index`. With include_usage every chunk carries "usage": null
    but the last, or with continuous_usage_stats (vLLM's) the counts so far."""
    if gen.kind == "chat":
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
        if text:
            delta["content"] = text
        if tool_calls:
            delta["tool_calls"] = tool_calls
        choice: dict[str, Any] = {
            "index": index,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": finish,
        }
        obj = "chat.completion.chunk"
    else:
        choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
        obj = "text_completion"
    out = {"id": gen.response_id, "object": obj, "created": gen.created, "model": gen.model,
           "choices": [choice]}  # fmt: skip
    if gen.include_usage:
        out["usage"] = counts if gen.usage_every_chunk else None
    return out


def usage_chunk(gen: Generation, counts: dict[str, int]) -> dict[str, Any]:
    obj = "chat.completion.chunk" if gen.kind == "chat" else "text_completion"
    return {"id": gen.response_id, "object": obj, "created": gen.created, "model": gen.model,
            "choices": [], "usage": counts}  # fmt: skip


def models_list(names: list[str], created: int) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": n, "object": "model", "created": created,
                                        "owned_by": "llm-operator"} for n in names]}  # fmt: skip
