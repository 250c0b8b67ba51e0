"""Triton python-backend model "ensemble" of the CPU reference runtime: the TensorRT-LLM ensemble's
external contract (text_input, max_tokens, stream, sampling inputs -> text_output) on TinyLM.

A dynamic batch is decoded in lockstep; in decoupled mode a streaming request gets one response per
token, the last one flagged final, and any request gets its final response as soon as it is done.

The operator ships this file inside the rendered repository (<repo>/ensemble/1/model.py). Triton's
python stub embeds the system libpython and ignores PYTHONPATH, so before importing anything beyond
the standard library (the stub itself imports numpy right after this module) it reads the
`python_path` parameter of its own config.pbtxt and puts those directories first on sys.path.
"""

import os
import re
import sys
from pathlib import Path


def _python_path() -> list[str]:
    config = (Path(__file__).resolve().parents[1] / "config.pbtxt").read_text()
    found = re.search(r'key:\s*"python_path"\s*value:\s*\{\s*string_value:\s*"([^"]*)"', config)
    return [p for p in (found.group(1) if found else "").split(os.pathsep) if p]


sys.path[:0] = [p for p in _python_path() if p not in sys.path]

import json  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from llm_operator.runtime.cpu_reference import BUILTIN_MODELS  # noqa: E402
from llm_operator.runtime.cpu_reference.tiny_lm import Sampler, TinyLM, encode  # noqa: E402


def _optional(request: Any, name: str) -> Any:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy().reshape(-1)


def _first(request: Any, name: str, default: Any) -> Any:
    values = _optional(request, name)
    if values is None or values.size == 0:
        return default
    return values[0].item() if isinstance(values[0], np.generic) else values[0]  # BYTES are bytes


def _text(text: str) -> Any:
    return pb_utils.InferenceResponse(
        [pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_))]
    )


def _error(message: str) -> Any:
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))


@dataclass
class Job:
    """One request of the batch being decoded."""

    request: Any
    prompt: str
    max_tokens: int
    stream: bool
    exclude_input: bool
    stop_words: list[str]
    sampler: Sampler
    generated: str = ""
    done: bool = False


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config["parameters"].items()}
        name = params["model"]
        if name not in BUILTIN_MODELS:
            raise pb_utils.TritonModelException(f"unknown builtin model {name!r}")
        # One thread per instance: Triton's instance count is the unit of CPU parallelism.
        torch.set_num_threads(1)
        self.lm = TinyLM(BUILTIN_MODELS[name], seed=int(params["weights_seed"]))
        self.max_input_len = int(params["max_input_len"])
        self.max_seq_len = int(params["max_seq_len"])
        self.exclude_input = params["exclude_input_in_output"] == "true"
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)

    def _job(self, request: Any) -> Job | str:
        """The request's job, or why it is refused (TensorRT-LLM refuses the same requests)."""
        prompt = _first(request, "text_input", b"").decode("utf-8", "replace")
        max_tokens = int(_first(request, "max_tokens", 0))
        stream = bool(_first(request, "stream", False))
        words = _optional(request, "stop_words")
        tokens = len(encode(prompt))
        if not tokens:
            return "text_input is empty"
        if tokens > self.max_input_len:
            return f"prompt has {tokens} tokens, more than max_input_len {self.max_input_len}"
        if max_tokens < 1 or tokens + max_tokens > self.max_seq_len:
            return f"max_tokens must be 1..{self.max_seq_len - tokens} for this prompt (max_seq_len)"
        if stream and not self.decoupled:
            return "stream=true needs a decoupled model (runtime.streaming: true)"
        return Job(
            request=request,
            prompt=prompt,
            max_tokens=max_tokens,
            stream=stream,
            exclude_input=bool(_first(request, "exclude_input_in_output", self.exclude_input)),
            stop_words=[w.decode("utf-8", "replace") for w in words if w] if words is not None else [],
            sampler=Sampler(
                temperature=float(_first(request, "temperature", 1.0)),
                top_k=int(_first(request, "top_k", 0)),
                top_p=float(_first(request, "top_p", 0.0)),
                seed=int(_first(request, "seed", 0)),
            ),
        )

    def _decode(self, jobs: list[Job], emit: Callable[[Job, str], None]) -> None:
        """emit(job, piece) sees every token; a job ends at max_tokens or on a stop word."""
        batch = self.lm.start([encode(j.prompt) for j in jobs])
        while True:
            tokens = batch.pick([j.sampler for j in jobs])
            for job, token in zip(jobs, tokens, strict=True):
                if not job.done:
                    job.generated += chr(token)
                    job.done = len(job.generated) >= job.max_tokens or any(
                        job.generated.endswith(w) for w in job.stop_words
                    )
                    emit(job, chr(token))
            if all(j.done for j in jobs):
                return
            batch.advance(tokens)

    @staticmethod
    def _result(job: Job) -> Any:
        return _text(job.generated if job.exclude_input else job.prompt + job.generated)

    def execute(self, requests: list[Any]) -> list[Any] | None:
        checked = [self._job(r) for r in requests]
        jobs = [j for j in checked if isinstance(j, Job)]
        if not self.decoupled:
            if jobs:
                self._decode(jobs, lambda job, piece: None)
            return [_error(j) if isinstance(j, str) else self._result(j) for j in checked]

        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        for request, job in zip(requests, checked, strict=True):
            if isinstance(job, str):
                request.get_response_sender().send(_error(job), flags=final)
        senders = {id(j): j.request.get_response_sender() for j in jobs}

        def emit(job: Job, piece: str) -> None:
            sender = senders[id(job)]
            if job.request.is_cancelled():  # the client left: free its slot in the batch
                job.done = True
                sender.send(_error("request cancelled"), flags=final)
            elif job.stream:
                sender.send(_text(piece), flags=final if job.done else 0)
            elif job.done:
                sender.send(self._result(job), flags=final)

        if jobs:
            self._decode(jobs, emit)
        return None
