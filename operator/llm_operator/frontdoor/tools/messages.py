"""Tool calls and their results in chat messages, as chat templates take them: an assistant message's
`tool_calls` with each call's arguments as an object (OpenAI sends them as a JSON string; Hugging
Face templates write `arguments | tojson` or iterate over them, so vLLM parses them the same way:
vllm/entrypoints/chat_utils.py, _postprocess_messages), and `tool` messages with the id of the call
they answer."""

from __future__ import annotations

import json
from typing import Any

from llm_operator.frontdoor.protocol import bad


def _call(call: object, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise bad(f'{where} must be {{"id", "type": "function", "function": {{"name", "arguments"}}}}',
                  "messages")  # fmt: skip
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except json.JSONDecodeError:
            raise bad(f"{where}.function.arguments is not valid JSON", "messages") from None
    if not isinstance(arguments, dict):
        raise bad(f"{where}.function.arguments must be a JSON object", "messages")
    assert isinstance(call, dict)
    return {**call, "function": {**function, "arguments": arguments}}


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with their tool calls' arguments as objects; tool messages checked."""
    out = []
    for i, message in enumerate(messages):
        calls = message.get("tool_calls")
        if calls is not None:
            if message["role"] != "assistant" or not isinstance(calls, list):
                raise bad(f"messages[{i}].tool_calls must be a list, on an assistant message", "messages")
            message = {**message, "tool_calls": [_call(c, f"messages[{i}].tool_calls[{j}]")
                                                 for j, c in enumerate(calls)]}  # fmt: skip
        if message["role"] == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise bad(f"messages[{i}] (role tool) needs the tool_call_id of the call it answers", "messages")
        out.append(message)
    return out
