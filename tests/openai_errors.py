"""A raw HTTP answer read as OpenAI's error format (the front door's tests on real sockets)."""

from __future__ import annotations

import json
from typing import Any


def openai_error(raw: bytes) -> tuple[int, dict[str, Any]]:
    """The status and the error object of `raw`, which must have exactly OpenAI's four fields."""
    head, _, body = raw.partition(b"\r\n\r\n")
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    return int(head.split(b" ", 2)[1]), error
