"""OpenAI's n, logprobs / top_logprobs and response_format, checked and put in the engine contract's
terms (pure; docs/architecture.md, "Structured outputs, tools, log probabilities and n: the
design"): `num_return_sequences`, `return_log_probs`, `guided_decoding_guide_type` and
`guided_decoding_guide`, as vLLM and trtllm-serve map them; on the LLM API contract the operator's
wrapper's `sampling_param_n`, `sampling_param_logprobs` and the same guide inputs
(runtime/llmapi_structured.py). A chat's tools are tools/request.py's: a guided tool_choice
(required, a named function) becomes the request's guide.

What a backend cannot do yet is a 400 `unsupported_parameter` naming the parameter:
- the LLM API contract (`pytorch`, and cpu-reference's llmapi contract, which the front door sees
  as `pytorch`) refuses top_logprobs > 0 until a GPU shows the PyTorch backend fills them;
- the engine contract returns each sampled token's log-probability only (`output_log_probs`), so
  top_logprobs > 0 and completions' logprobs > 0 are refused there for good;
- a guide needs the engine's guided decoder: every backend configures one (xgrammar; on
  `tensorrt-engine` over the tokenizer info the engine build writes beside the engine), but an
  engine without that file serves without one (runtime/launcher.py), and then guides are refused
  (`unguided`, from the pod's environment: __main__.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from llm_operator.frontdoor.protocol import TOOLS, ApiError, Extras, bad
from llm_operator.frontdoor.tools import request as tools_request

MAX_CHOICES = 8  # each sequence takes a batch slot of the engine
MAX_SCHEMA_BYTES = 64 * 1024
MAX_TOP_LOGPROBS = {"chat": 20, "completion": 5}  # OpenAI's bounds
# Why a tensorrt-engine pod has no guided decoder (contract.XGRAMMAR_TOKENIZER_INFO).
NO_TOKENIZER_INFO = (
    "its engine has no xgrammar tokenizer info beside it that the guided decoder can load (an engine "
    "built before the operator wrote it, or a prebuilt one without it), so it runs without one"
)


def _unsupported(name: str, backend: str, why: str) -> ApiError:
    return bad(f"{name} is not supported by this model's backend ({backend}): {why}; remove it", name,
               "unsupported_parameter")  # fmt: skip


def _count(body: Mapping[str, Any], name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise bad(f"{name} must be an integer between {low} and {high}", name)
    return value


def _n(body: Mapping[str, Any]) -> int:
    return _count(body, "n", 1, MAX_CHOICES) or 1


def _logprobs(body: Mapping[str, Any], kind: str, backend: str) -> bool:
    """Whether log-probabilities are asked for: chat's logprobs true (top_logprobs 0..20 beside),
    completions' logprobs 0..5 (the number of alternatives)."""
    most = MAX_TOP_LOGPROBS[kind]
    if kind == "chat":
        wanted = body.get("logprobs")
        if wanted is not None and not isinstance(wanted, bool):
            raise bad("logprobs must be true or false", "logprobs")
        top, top_name = _count(body, "top_logprobs", 0, most), "top_logprobs"
        if top and not wanted:
            raise bad("top_logprobs needs logprobs: true", "top_logprobs")
    else:
        top, top_name = _count(body, "logprobs", 0, most), "logprobs"
        wanted = top is not None
    if not wanted:
        return False
    if top and backend == "pytorch":
        raise _unsupported(top_name, backend, "alternatives are not yet checked on this backend; send 0")
    if top:
        raise _unsupported(top_name, backend, "the engine returns the sampled token's log-probability "
                           "only, no alternatives; send 0")  # fmt: skip
    return True


def _guide(body: Mapping[str, Any], backend: str, unguided: str) -> tuple[str, str]:
    """response_format as a guide: json_object -> `json`, json_schema -> `json_schema` with the
    schema under json_schema.schema (OpenAI's wrapper is not part of it); strict is accepted, the
    output always matches."""
    value = body.get("response_format")
    if value is None:
        return "", ""
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return "", ""
    if kind not in ("json_object", "json_schema"):
        raise bad("response_format.type must be text, json_object or json_schema", "response_format",
                  "unsupported_parameter" if isinstance(kind, str) else None)  # fmt: skip
    if unguided:
        raise _unsupported("response_format", backend, unguided)
    if kind == "json_object":
        return "json", ""
    spec = value.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise bad("response_format.json_schema.schema must be a JSON Schema object", "response_format",
                  "invalid_json_schema")  # fmt: skip
    strict = spec.get("strict") if isinstance(spec, dict) else None
    if strict is not None and not isinstance(strict, bool):
        raise bad("response_format.json_schema.strict must be true or false", "response_format")
    text = json.dumps(schema, separators=(",", ":"))
    if len(text.encode()) > MAX_SCHEMA_BYTES:
        raise bad(f"response_format's schema is over {MAX_SCHEMA_BYTES // 1024} KiB", "response_format",
                  "invalid_json_schema")  # fmt: skip
    return "json_schema", text


def extras(
    body: Mapping[str, Any], kind: str, backend: str, tool_parser: str = "", unguided: str = ""
) -> Extras:
    """The request's Extras, or ApiError. tool_parser: the deployment's (spec.model.toolCallParser);
    unguided: why its engine has no guided decoder, "" when it has one."""
    if kind != "chat":
        for name in TOOLS:
            if body.get(name) not in (None, [], "none"):
                raise bad(f"{name} is for /v1/chat/completions (a completion's prompt has no tools); "
                          "remove it", name, "unsupported_parameter")  # fmt: skip
        return Extras(_n(body), _logprobs(body, kind, backend))
    guide_type, guide = _guide(body, backend, unguided)
    tools = tools_request.check(body, parser=tool_parser, unguided=unguided, backend=backend)
    if tools.guide:
        guide_type, guide = "json_schema", tools.guide
    return Extras(_n(body), _logprobs(body, kind, backend), guide_type, guide, tools.tools, tools.parser,
                  tools.name)  # fmt: skip


def engine_inputs(extras: Extras) -> dict[str, Any]:
    """The engine contract's inputs for them (none for a request without any)."""
    inputs: dict[str, Any] = {}
    if extras.n > 1:
        inputs["num_return_sequences"] = extras.n
    if extras.logprobs:
        inputs["return_log_probs"] = True
    if extras.guide_type:
        inputs["guided_decoding_guide_type"] = extras.guide_type
        if extras.guide:
            inputs["guided_decoding_guide"] = extras.guide
    return inputs


def llmapi_inputs(extras: Extras) -> dict[str, Any]:
    """The LLM API contract's inputs for them (the operator's wrapper's; none for a request without
    any): logprobs 0, the sampled token's only."""
    inputs: dict[str, Any] = {}
    if extras.n > 1:
        inputs["sampling_param_n"] = extras.n
    if extras.logprobs:
        inputs["sampling_param_logprobs"] = 0
    if extras.guide_type:
        inputs["guided_decoding_guide_type"] = extras.guide_type
        if extras.guide:
            inputs["guided_decoding_guide"] = extras.guide
    return inputs
