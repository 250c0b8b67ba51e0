"""LiteLLM's OpenAI-compatible provider (`openai/<model>` at an api_base) against a deployment: run
by tests/e2e/clients.py in LiteLLM's own environment (scripts/ensure-tool-venv.sh litellm), not the
project's. usage: python litellm_run.py BASE_URL MODEL REQUESTS. Sends REQUESTS chat completions
each way (sync, sync streamed, async concurrently) and REQUESTS text completions, and prints one
JSON line: {"ok": N, "failed": N, "errors": [...]}.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable
from typing import Any

# Before the import: LiteLLM reads its model price map from the Internet unless told otherwise.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
import litellm

MESSAGES = [{"role": "user", "content": "Once upon a time"}]
MAX_TOKENS = 8


def main() -> None:
    base, model, requests = sys.argv[1], f"openai/{sys.argv[2]}", int(sys.argv[3])
    common: dict[str, Any] = {"model": model, "api_base": base, "api_key": "unused", "max_tokens": MAX_TOKENS,
                              "temperature": 0, "num_retries": 0}  # fmt: skip
    ok, errors = 0, []

    def check(text: Any, usage: Any) -> None:
        if not text or usage is None or usage.completion_tokens <= 0:
            raise AssertionError(f"no text or usage: {text!r}, {usage!r}")

    def sync() -> None:
        done = litellm.completion(messages=MESSAGES, **common)
        check(done.choices[0].message.content, done.usage)

    def streamed() -> None:
        usage = {"include_usage": True}
        chunks = list(litellm.completion(messages=MESSAGES, stream=True, stream_options=usage, **common))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        check(text, next((c.usage for c in reversed(chunks) if getattr(c, "usage", None)), None))

    def text_completion() -> None:
        done = litellm.text_completion(prompt="The sea", **common)
        check(done.choices[0].text, done.usage)

    def attempt(call: Callable[[], None]) -> None:
        nonlocal ok
        try:
            call()
            ok += 1
        except Exception as e:  # each failure is counted and reported, as a benchmark's are
            errors.append(f"{call.__name__}: {type(e).__name__}: {e}"[:500])

    for call in (sync, streamed, text_completion):
        for _ in range(requests):
            attempt(call)

    async def acompletion() -> None:
        done = await litellm.acompletion(messages=MESSAGES, **common)
        check(done.choices[0].message.content, done.usage)

    async def concurrently() -> list[BaseException | None]:
        return list(await asyncio.gather(*(acompletion() for _ in range(requests)), return_exceptions=True))

    for failed in asyncio.run(concurrently()):
        if failed is None:
            ok += 1
        else:
            errors.append(f"acompletion: {type(failed).__name__}: {failed}"[:500])
    print(json.dumps({"ok": ok, "failed": len(errors), "errors": errors}))


if __name__ == "__main__":
    main()
