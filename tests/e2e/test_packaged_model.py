"""examples/smollm2.yaml as a user applies it: the packaged SmolLM2-135M-Instruct becomes Ready on
the real node from the cpu-runtime image's own files, and the official openai SDK, at the URL
status.endpoints.openai names, gets an answer in words that ends on the model's end token, streamed
as it is answered whole. A real model's tokenizer, chat template (its default system prompt) and
end token run through the pod's front door."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.chat import base_url
from e2e.cluster.testing import E2ECluster, Kubectl, condition, is_true, wait_for
from tests.e2e import openai_sdk

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "smollm2.yaml"
MAX = 48
QUESTION: Any = [{"role": "user", "content": "What is the capital of France?"}]


def test_smollm2_answers_in_words_and_streams_the_same_answer(
    operator: None, embedded: E2ECluster, kubectl: Kubectl, namespace: str
) -> None:
    kubectl.apply(yaml.safe_load(EXAMPLE.read_text()), namespace=namespace)
    ld = wait_for("smollm2 Ready", lambda: kubectl.get("llmdeployment", "smollm2", namespace),
                  lambda d: is_true(d, "Ready"), timeout=300)  # fmt: skip
    url = ((ld or {}).get("status") or {}).get("endpoints", {}).get("openai")
    assert url == f"http://smollm2.{namespace}.svc:8080/v1", condition(ld, "Ready")
    assert embedded.launcher is not None
    with base_url(embedded.launcher, url) as served_url:
        client = openai_sdk.client(served_url)
        assert [m.id for m in client.models.list()] == ["HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2"]
        done = client.chat.completions.create(
            model="smollm2", messages=QUESTION, max_tokens=48, temperature=0
        )
        (choice,) = done.choices
        assert "Paris" in (choice.message.content or "")
        assert choice.finish_reason == "stop"  # its end token, before max_tokens
        stream = client.chat.completions.create(
            model="smollm2", messages=QUESTION, max_tokens=48, temperature=0, stream=True
        )
        assert (
            "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == choice.message.content
        )
