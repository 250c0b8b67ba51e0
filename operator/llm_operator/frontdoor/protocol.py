"""The OpenAI API's requests and responses, and their translation to Triton's generate inputs (pure).

A request body is checked field by field: what the backend cannot honour is refused with a 400
naming the parameter (never ignored), what it can is mapped to the inputs the deployment's Triton
model declares (model_repo_templates/: the ensemble's `temperature`, `top_p`, `seed`,
`stop_words`; the llmapi model's `sampling_param_*`). Errors are OpenAI's shape,
{"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import json
import math
import secrets
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llm_operator.frontdoor.sampling import OPENAI, Defaults

UINT64_MAX = 2**64 - 1
MAX_STOP_SEQUENCES = 4  # OpenAI's own limit on `stop`
# Characters in one stop sequence: matching holds back a tail of up to this many characters and
# scans it at each token (responses.Stops), so an unbounded one would cost quadratic time.
MAX_STOP_CHARS = 1024
# Objects and arrays within each other in a request body (OpenAI's own bodies nest a few levels;
# a chat template walking a deeper one recurses as deep).
MAX_JSON_DEPTH = 64


class ApiError(Exception):
    """A request the front door answers with an error in OpenAI's format."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error") -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


# Parameters no backend of this operator honours. Their default values are accepted (SDKs and
# frameworks send them explicitly), anything else is refused: best_of > 1 would need sequences
# ranked by the server; OpenAI's deprecated functions / function_call have tools in their place.
# n, logprobs and response_format: structured.py; tools, tool_choice, parallel_tool_calls: tools/.
UNSUPPORTED: dict[str, tuple[object, ...]] = {
    "best_of": (1,),
    "echo": (False,),
    "suffix": ("",),
    "logit_bias": ({},),
    "functions": ([],),
    "function_call": ("none",),
    "audio": (),
    "modalities": (["text"],),
    "prediction": (),
    "reasoning_effort": (),
    "web_search_options": (),
}
# Accepted and without effect on generation: what OpenAI uses for its own bookkeeping.
IGNORED = ("user", "metadata", "store", "service_tier", "stream_options", "stream")
# What vLLM and trtllm-serve take beyond OpenAI's parameters, with the value that leaves generation
# as it is (sent by clients that set nothing: inference-perf sends ignore_eos false every time).
ENGINE_KNOBS: dict[str, object] = {
    "top_k": 0,
    "min_tokens": 0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "ignore_eos": False,
}
# The knobs each backend's Triton model takes. The ensembles (model_repo_templates/: TensorRT-LLM's
# inflight_batcher_llm and the CPU runtime, which speaks its contract) have an input for each; the
# llmapi model reads only the sampling params upstream's helpers.py lists (triton_backend/all_models/
# llmapi/tensorrt_llm/1/helpers.py, get_sampling_params_from_request).
BACKEND_KNOBS: dict[str, frozenset[str]] = {
    "tensorrt-engine": frozenset(ENGINE_KNOBS),
    "cpu-reference": frozenset(ENGINE_KNOBS),
    "pytorch": frozenset({"top_k", "presence_penalty", "frequency_penalty"}),
}
# Accepted at the value every backend has; any other value is refused, with why. Decoding: the
# ensembles' postprocessing model sets skip_special_tokens in its config, not per request
# (model_repo_templates/inflight_batcher_llm/postprocessing.pbtxt.j2), and the llmapi model has no
# input for either. Stop ids: the ensemble takes stop words as text (`stop_words`, tokenized by its
# preprocessing model), the llmapi model as strings (`sampling_param_stop`); neither takes ids.
FIXED: dict[str, tuple[object, str]] = {
    "skip_special_tokens": (True, "the engine's detokenizer is configured per model, not per request, "
                            "and skips special tokens"),
    "spaces_between_special_tokens": (True, "the engine's detokenizer is configured per model, not "
                                      "per request"),
    "stop_token_ids": ([], "the engines here take stop sequences as text only; send the token's text "
                       "in stop"),
}  # fmt: skip
# Chat template variables the server sets itself (chat.py's render_chat).
TEMPLATE_RESERVED = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token", "tools",
                               "documents", "raise_exception", "strftime_now"})  # fmt: skip
# n, logprobs, top_logprobs and response_format: structured.py.
COMMON = ("model", "max_tokens", "stop", "temperature", "top_p", "seed", "n", "logprobs", *ENGINE_KNOBS,
          *FIXED, *IGNORED)  # fmt: skip
TOOLS = ("tools", "tool_choice", "parallel_tool_calls")
CHAT = (
    "messages",
    "max_completion_tokens",
    "chat_template_kwargs",
    "top_logprobs",
    "response_format",
    *TOOLS,
)
KNOWN = {
    "completion": {*COMMON, "prompt", *UNSUPPORTED, *TOOLS},  # tools: refused there (structured.py)
    "chat": {*COMMON, *CHAT, *UNSUPPORTED},
}


@dataclass(frozen=True)
class Limits:
    """The engine's maxInputLen and maxSeqLen (0: unknown, Triton's own refusal is passed on)."""

    max_input_len: int = 0
    max_seq_len: int = 0


@dataclass(frozen=True)
class Extras:
    """n, log probabilities, a guide and tools, checked (structured.py, tools/request.py), in the
    engine contract's terms."""

    n: int = 1
    logprobs: bool = False  # each sampled token's log-probability
    guide_type: str = ""  # guided_decoding_guide_type ("": none)
    guide: str = ""
    tools: list[dict[str, Any]] | None = None  # for the chat template's `tools`
    parser: str = ""  # how each choice's text is read for tool calls (tools/parsers.py; "": not)
    tool: str = ""  # a named tool_choice's function


@dataclass
class Generation:
    """One request, checked: what the server asks Triton for and how it answers the client."""

    kind: str  # completion | chat
    model: str  # the name the client asked for, echoed in responses
    prompt: str
    max_tokens: int
    stream: bool = False
    include_usage: bool = False
    stop: list[str] = field(default_factory=list)
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    top_k: int | None = None
    min_tokens: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    ignore_eos: bool = False
    usage_every_chunk: bool = False  # stream_options.continuous_usage_stats (vLLM's)
    template_kwargs: dict[str, Any] = field(default_factory=dict)  # chat_template_kwargs
    prompt_ids: list[int] = field(default_factory=list)  # the engine contract's input_ids
    extras: Extras = field(default_factory=Extras)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def response_id(self) -> str:
        return f"{'chatcmpl' if self.kind == 'chat' else 'cmpl'}-{self.id}"


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise bad(f"the request body is not valid JSON ({str(e)[:200]}); send a JSON object") from None
    except RecursionError:  # the C parser's own depth limit, near the interpreter's recursion limit
        raise _too_deep() from None
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    if _depth_beyond(body, MAX_JSON_DEPTH):
        raise _too_deep()
    return body


def _too_deep() -> ApiError:
    return bad(f"the request body nests objects and arrays more than {MAX_JSON_DEPTH} deep")


def _depth_beyond(value: object, limit: int) -> bool:
    """Whether containers nest more than `limit` deep (iterative: no recursion to exhaust)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, dict | list):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False


def _number(body: Mapping[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise bad(f"{name} must be a number", name)
    if not low <= value <= high:
        raise bad(f"{name} must be between {low:g} and {high:g}", name)
    return float(value)


def _integer(body: Mapping[str, Any], name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(f"{name} must be an integer", name)
    if not low <= value <= high:
        raise bad(f"{name} must be between {low} and {high}", name)
    return value


def _stop(body: Mapping[str, Any]) -> list[str]:
    value = body.get("stop")
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad("stop must be a string or a list of strings", "stop")
    if len(stops) > MAX_STOP_SEQUENCES:
        raise bad(f"stop takes at most {MAX_STOP_SEQUENCES} sequences", "stop")
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise bad(f"a stop sequence has at most {MAX_STOP_CHARS} characters on this server", "stop")
    return [s for s in stops if s]


def refuse_unsupported(body: Mapping[str, Any], kind: str, backend: str) -> None:
    for name, defaults in UNSUPPORTED.items():
        if name in body and body[name] is not None and body[name] not in defaults:
            raise bad(f"{name} is not supported by this server; remove it from the request", name,
                      "unsupported_parameter")  # fmt: skip
    for name, (value, why) in FIXED.items():
        if body.get(name) is not None and body[name] != value:
            raise bad(f"{name} can only be {json.dumps(value)} on this server ({why}); remove it", name,
                      "unsupported_parameter")  # fmt: skip
    takes = BACKEND_KNOBS.get(backend, frozenset())
    for name, neutral in ENGINE_KNOBS.items():
        value = body.get(name)
        if (
            name not in takes
            and value is not None
            and value != neutral
            and not (name == "top_k" and value == -1)
        ):
            raise bad(f"{name} is not supported by this model's backend ({backend}); remove it or "
                      f"send {json.dumps(neutral)}", name, "unsupported_parameter")  # fmt: skip
    unknown = sorted(set(body) - KNOWN[kind])
    if unknown:
        raise bad(f"unknown parameter {unknown[0]}; remove it from the request", unknown[0],
                  "unknown_parameter")  # fmt: skip


def check(
    body: Mapping[str, Any], kind: str, limits: Limits, *, backend: str, defaults: Defaults = OPENAI
) -> Generation:
    """The request's Generation, prompt not yet known (the server renders or reads it), or ApiError.
    What the request leaves out of temperature, top_p, top_k and repetition_penalty is `defaults`'
    (OpenAI's, or the model's generation_config.json: sampling.py); repetition_penalty only where
    the backend takes it. A sampled request without a seed gets a new one, so that it is not the
    same text each time (the engines' own default seed is 0): OpenAI's and vLLM's meaning."""
    refuse_unsupported(body, kind, backend)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model is required: name one of the models GET /v1/models lists", "model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("stream must be true or false", "stream")
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or not stream):
        raise bad("stream_options needs stream: true and must be an object", "stream_options")
    include_usage = bool(options and options.get("include_usage"))
    most = limits.max_seq_len - 1 if limits.max_seq_len else 2**31 - 1
    names = ("max_completion_tokens", "max_tokens") if kind == "chat" else ("max_tokens",)
    max_tokens = next((v for n in names if (v := _integer_limit(body, n, most, limits)) is not None), None)
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool | None):
        raise bad("ignore_eos must be true or false", "ignore_eos")
    template_kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(template_kwargs, dict):
        raise bad("chat_template_kwargs must be an object (variables for the chat template)",
                  "chat_template_kwargs")  # fmt: skip
    if taken := sorted(set(template_kwargs) & TEMPLATE_RESERVED):
        raise bad(f"chat_template_kwargs cannot set {taken[0]}: the server sets it", "chat_template_kwargs")
    top_k = _integer(body, "top_k", -1, 2**31 - 1)
    if top_k is None:
        top_k = defaults.top_k
    temperature = _number(body, "temperature", 0.0, 2.0)
    temperature = defaults.temperature if temperature is None else temperature
    top_p = _number(body, "top_p", 0.0, 1.0)
    repetition = _number(body, "repetition_penalty", 0.01, 2.0)
    if repetition is None and "repetition_penalty" in BACKEND_KNOBS.get(backend, ()):
        repetition = defaults.repetition_penalty
    seed = _integer(body, "seed", 0, UINT64_MAX)
    return Generation(
        kind=kind,
        model=model,
        prompt="",
        max_tokens=16 if max_tokens is None and kind == "completion" else (max_tokens or 0),
        stream=stream,
        include_usage=include_usage,
        stop=_stop(body),
        temperature=temperature,
        top_p=defaults.top_p if top_p is None else top_p,
        seed=secrets.randbits(63) if seed is None and temperature > 0 else seed,
        top_k=top_k if top_k and top_k > 0 else None,  # vLLM's -1 and TensorRT-LLM's 0: no top-k
        min_tokens=_integer(body, "min_tokens", 0, most) or None,
        repetition_penalty=_nonneutral(repetition, 1.0),
        presence_penalty=_nonneutral(_number(body, "presence_penalty", -2.0, 2.0), 0.0),
        frequency_penalty=_nonneutral(_number(body, "frequency_penalty", -2.0, 2.0), 0.0),
        ignore_eos=bool(ignore_eos),
        usage_every_chunk=include_usage and bool(options and options.get("continuous_usage_stats")),
        template_kwargs=template_kwargs,
    )


def _nonneutral(value: float | None, neutral: float) -> float | None:
    """None for the value that changes nothing: such inputs are not sent to the engine."""
    return None if value is None or value == neutral else value


def _integer_limit(body: Mapping[str, Any], name: str, most: int, limits: Limits) -> int | None:
    value = body.get(name)
    if isinstance(value, int) and not isinstance(value, bool) and value > most and limits.max_seq_len:
        raise bad(f"{name} is {value}, beyond this model's maxSeqLen of {limits.max_seq_len} tokens "
                  "(prompt included); ask for fewer", name)  # fmt: skip
    return _integer(body, name, 1, most)


def fit(gen: Generation, prompt_tokens: int, limits: Limits) -> None:
    """The prompt's length against the engine's limits; an unset max_tokens takes what is left."""
    if limits.max_input_len and prompt_tokens > limits.max_input_len:
        raise bad(f"the prompt has {prompt_tokens} tokens, more than this model's maxInputLen of "
                  f"{limits.max_input_len}; shorten it", "messages" if gen.kind == "chat" else "prompt",
                  "context_length_exceeded")  # fmt: skip
    room = limits.max_seq_len - prompt_tokens if limits.max_seq_len else 0
    if not gen.max_tokens:
        gen.max_tokens = room if limits.max_seq_len else 16
    elif limits.max_seq_len and gen.max_tokens > room:
        raise bad(f"the prompt's {prompt_tokens} tokens and max_tokens {gen.max_tokens} exceed this "
                  f"model's maxSeqLen of {limits.max_seq_len}; ask for at most {room} tokens",
                  "max_tokens", "context_length_exceeded")  # fmt: skip
    if gen.max_tokens < 1:
        raise bad(f"the prompt's {prompt_tokens} tokens leave no room under maxSeqLen "
                  f"{limits.max_seq_len}; shorten it", "messages" if gen.kind == "chat" else "prompt",
                  "context_length_exceeded")  # fmt: skip


def completion_prompt(body: Mapping[str, Any]) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise bad("prompt must be one string (token arrays and batches of prompts are not supported)",
                  "prompt")  # fmt: skip
    if not prompt:
        raise bad("prompt is empty", "prompt")
    return prompt


def chat_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The messages as the chat template takes them: content parts of type text joined into one
    string, one part a line (templates expect strings; other part types cannot be served by a text
    model)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad(f"messages[{i}] must be an object with a role", "messages")
        content = message.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):  # fmt: skip
                raise bad(f"messages[{i}].content: only text parts are supported", "messages")
            content = "\n".join(p["text"] for p in content)  # as vLLM joins a message's text parts
        elif content is not None and not isinstance(content, str):
            raise bad(f"messages[{i}].content must be a string or a list of text parts", "messages")
        out.append({**message, "content": content})
    return out
