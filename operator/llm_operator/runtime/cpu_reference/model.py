"""Triton python-backend model with the TensorRT-LLM ensemble's external contract:
text_input, max_tokens, stream (+ temperature, random_seed) -> text_output, streamed one response
per token in decoupled mode.

Triton's python stub embeds the system libpython and ignores PYTHONPATH, so the launcher passes
where numpy and llm_operator live in LLMOP_PYTHONPATH and this file prepends it before importing.
"""

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

sys.path[:0] = [p for p in os.environ.get("LLMOP_PYTHONPATH", "").split(os.pathsep) if p]

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from llm_operator.runtime.cpu_reference.tiny_lm import TinyLM  # noqa: E402


def _scalar(request: Any, name: str, default: Any) -> Any:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy().reshape(-1)[0]


def _text(piece: str) -> Any:
    return pb_utils.Tensor("text_output", np.array([piece.encode("utf-8")], dtype=np.object_))


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.exclude_input = params.get("exclude_input_in_output", "true") == "true"
        self.lm = TinyLM(seed=int(params.get("seed", "0")), max_seq_len=int(params.get("max_seq_len", "512")))

    def _generate(self, request: Any) -> tuple[str, Iterator[str], bool]:
        prompt = _scalar(request, "text_input", b"").decode("utf-8", "replace")
        max_tokens = int(_scalar(request, "max_tokens", 16))
        temperature = float(_scalar(request, "temperature", 0.0))
        seed = int(_scalar(request, "random_seed", 0))
        stream = bool(_scalar(request, "stream", False))
        return prompt, self.lm.generate(prompt, max_tokens, temperature, seed), stream

    def execute(self, requests: list[Any]) -> list[Any] | None:
        if not self.decoupled:
            responses = []
            for request in requests:
                prompt, pieces, _ = self._generate(request)
                text = "".join(pieces)
                responses.append(
                    pb_utils.InferenceResponse([_text(text if self.exclude_input else prompt + text)])
                )
            return responses
        for request in requests:
            sender = request.get_response_sender()
            prompt, pieces, stream = self._generate(request)
            if stream:
                for piece in pieces:
                    sender.send(pb_utils.InferenceResponse([_text(piece)]))
            else:
                text = "".join(pieces)
                sender.send(
                    pb_utils.InferenceResponse([_text(text if self.exclude_input else prompt + text)])
                )
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
