"""A chat request's tools, tool_choice and parallel_tool_calls, checked and mapped as vLLM maps them
(vllm/entrypoints/openai/protocol.py, ChatCompletionRequest._get_guided_json_from_tool):
- none: the tools reach the chat template, the text is the answer;
- auto (the default with tools): no guide, the deployment's parser (spec.model.toolCallParser)
  reads calls out of the text; without one, a 400 naming the field;
- required: a guide, a JSON array (minItems 1) of `{name, parameters}`, one anyOf branch per tool
  so that each name carries its own parameters' schema, read by the `required` parser;
- a named function: a guide, that function's parameters; the text is the call's arguments.
A guide needs the engine's guided decoder: where it has none (tensorrt-engine, for now), required
and named are refused as response_format is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llm_operator.frontdoor.protocol import ApiError, bad
from llm_operator.frontdoor.tools.parsers import NAME_CHARS, PARSERS

MAX_TOOLS = 128  # OpenAI's own limit
MAX_TOOLS_BYTES = 64 * 1024  # as response_format's schema: the guide made of them is compiled per request
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}  # OpenAI: parameters omitted


@dataclass(frozen=True)
class Tools:
    """What the request's tools ask of the front door."""

    tools: list[dict[str, Any]] | None = None  # for the chat template, as the client sent them
    parser: str = ""  # how the text is read: a PARSERS family, "required", "named" ("": not read)
    name: str = ""  # the named function
    guide: str = ""  # a json_schema guide ("": none)


def _tool(value: object, i: int) -> dict[str, Any]:
    where = f"tools[{i}]"
    if not isinstance(value, dict) or value.get("type") != "function":
        raise bad(f'{where} must be {{"type": "function", "function": {{...}}}} (the only tool type '
                  "a model served here can call)", "tools")  # fmt: skip
    function = value.get("function")
    if not isinstance(function, dict):
        raise bad(f"{where}.function must be an object with a name", "tools")
    name = function.get("name")
    if not isinstance(name, str) or not 0 < len(name) <= 64 or not set(name) <= NAME_CHARS:
        raise bad(f"{where}.function.name must be 1 to 64 letters, digits, _ or -", "tools")
    if not isinstance(function.get("description", ""), str):
        raise bad(f"{where}.function.description must be a string", "tools")
    if not isinstance(function.get("parameters", {}), dict):
        raise bad(f"{where}.function.parameters must be a JSON Schema object", "tools", "invalid_json_schema")
    if not isinstance(function.get("strict", False), bool | None):
        raise bad(f"{where}.function.strict must be true or false", "tools")
    return value


def _tools(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    value = body.get("tools")
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_TOOLS:
        raise bad(f"tools must be a list of at most {MAX_TOOLS} functions", "tools")
    tools = [_tool(t, i) for i, t in enumerate(value)]
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) < len(names):
        raise bad("tools name a function twice; give each a name of its own", "tools")
    if len(json.dumps(tools, separators=(",", ":")).encode()) > MAX_TOOLS_BYTES:
        raise bad(f"tools are over {MAX_TOOLS_BYTES // 1024} KiB", "tools")
    return tools


def _choice(body: Mapping[str, Any], names: list[str]) -> tuple[str, str]:
    """tool_choice as (mode, the named function)."""
    value = body.get("tool_choice")
    if value is None:
        return ("auto" if names else "none"), ""
    if value in ("none", "auto", "required"):
        mode = str(value)
        name = ""
    elif isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("function"),
                                                                                     dict):  # fmt: skip
        mode, name = "named", value["function"].get("name")
        if name not in names:
            raise bad(f"tool_choice names the function {name!r}, which tools do not have", "tool_choice")
    else:
        raise bad('tool_choice must be "none", "auto", "required" or {"type": "function", "function": '
                  '{"name": ...}}', "tool_choice")  # fmt: skip
    if mode != "none" and not names:
        raise bad(f"tool_choice {mode} needs tools", "tool_choice")
    return mode, str(name)


def _parameters(tool: dict[str, Any]) -> dict[str, Any]:
    parameters: dict[str, Any] = tool["function"].get("parameters") or NO_PARAMETERS
    return parameters


def required_schema(tools: list[dict[str, Any]], most: int | None) -> dict[str, Any]:
    """tool_choice required's guide: one or more calls, each of a function the tools have."""
    calls = [{"type": "object", "properties": {"name": {"type": "string", "enum": [t["function"]["name"]]},
                                               "parameters": _parameters(t)},
              "required": ["name", "parameters"]} for t in tools]  # fmt: skip
    schema: dict[str, Any] = {"type": "array", "minItems": 1,
                              "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}  # fmt: skip
    if most is not None:
        schema["maxItems"] = most
    return schema


def check(body: Mapping[str, Any], *, parser: str, unguided: str, backend: str) -> Tools:
    """The request's Tools, or ApiError. parser: the deployment's (spec.model.toolCallParser, "" if
    unset); unguided: why the backend's engine has no guided decoder ("" when it has one)."""
    tools = _tools(body)
    names = [t["function"]["name"] for t in tools]
    mode, name = _choice(body, names)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad("parallel_tool_calls must be true or false", "parallel_tool_calls")
    template = tools or None  # the template sees them whatever tool_choice is, as vLLM's
    if mode == "none":
        return Tools(template)
    if mode == "auto":
        if parallel is False:
            raise bad("parallel_tool_calls false is not supported with tool_choice auto (nothing keeps "
                      "the model to one call); send tool_choice required, or remove it",
                      "parallel_tool_calls", "unsupported_parameter")  # fmt: skip
        if parser not in PARSERS:
            raise bad("tool_choice auto (the default when tools are sent) needs the deployment to name "
                      "its model's tool-call format in spec.model.toolCallParser; set it, or send "
                      'tool_choice "required", a named function or "none"',
                      "tool_choice" if "tool_choice" in body else "tools",
                      "unsupported_parameter")  # fmt: skip
        return Tools(template, parser)
    if unguided:
        raise ApiError(400, f"tool_choice {mode} is not supported by this model's backend ({backend}): "
                       f"{unguided}; send tool_choice auto or none", param="tool_choice",
                       code="unsupported_parameter")  # fmt: skip
    if body.get("response_format") not in (None, {"type": "text"}):
        raise bad(f"tool_choice {mode} and response_format each constrain the output; send one of them",
                  "tool_choice")  # fmt: skip
    if mode == "named":
        (tool,) = (t for t in tools if t["function"]["name"] == name)
        schema = _parameters(tool)
    else:
        schema = required_schema(tools, 1 if parallel is False else None)
    guide = json.dumps(schema, separators=(",", ":"))
    return Tools(template, mode, name, guide)
