"""Triton python-backend model "ensemble" of the CPU reference runtime on the engine contract: the
TensorRT-LLM ensemble's text contract (text_input, max_tokens, stream, the sampling inputs,
stop_words -> text_output) for clients of /v2, composed around the repository's `tensorrt_llm`
model (model.py), the only one that loads the weights, decodes, and exports the load gauges, the
time-to-first-response histogram and the fault knob. On GPUs the ensemble is preprocessing ->
tensorrt_llm -> postprocessing; here one model does both ends through Triton's BLS, as upstream's
own `tensorrt_llm_bls` does (NVIDIA/TensorRT-LLM triton_backend/all_models/inflight_batcher_llm/
tensorrt_llm_bls/1/model.py, stored copy 0ef1f21e): it encodes the prompt with the model's codec
(served.codec: the tokenizer only, no weights), calls `tensorrt_llm` with upstream's input names, and
decodes each request's ids with one incremental decoder.

Why BLS and not a Triton ensemble (platform "ensemble") of preprocessing / postprocessing models:
an ensemble's postprocessing decodes each response's ids alone, so a streamed character split
across tokens arrives as U+FFFD and SentencePiece spaces are lost, the bug upstream's BLS works
around with `accumulate_tokens`. Here one decoder per request carries its state across responses,
so /v2 streams the text the OpenAI front door streams, and streaming keeps the ensemble's
semantics: decoupled, one response per token that completes text, then an empty final response
(upstream's BLS sends its COMPLETE_FINAL flag alone, after the last text).

Stop words are matched in the text (upstream's BLS check_stop_words, streaming and not): the text
ends with the stop word. Triton 2.51's python backend can cancel neither a BLS request nor (the
CPU `tensorrt_llm` declaring no `stop` input) ask the engine to end it, so after a stop word or a
client's cancellation the engine's request runs on to its max_tokens, unanswered.

Every request runs in a thread of its own, so a batch's requests reach `tensorrt_llm` together and
are decoded in one of its batches; in decoupled mode execute() returns at once.

The operator ships this file as the repository's ensemble/1/model.py; like model.py it first puts
the `python_path` parameter of its config.pbtxt on sys.path (Triton's stub ignores PYTHONPATH).
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
import threading  # noqa: E402
from collections.abc import Callable, Iterable  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from llm_operator.runtime.cpu_reference import served  # noqa: E402
from llm_operator.runtime.cpu_reference.faults import INJECTED  # noqa: E402

ENGINE = "tensorrt_llm"
# Ensemble input -> tensorrt_llm input, passed on as sent (upstream's ensemble config.pbtxt maps
# them through preprocessing, max_tokens -> REQUEST_OUTPUT_LEN -> request_output_len, or straight).
PASSED = {
    "max_tokens": "request_output_len",
    "top_k": "runtime_top_k",
    "top_p": "runtime_top_p",
    "temperature": "temperature",
    "seed": "seed",
    "end_id": "end_id",
    "min_tokens": "min_tokens",
    "repetition_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _first(request: Any, name: str, default: Any) -> Any:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    values = None if tensor is None else tensor.as_numpy().reshape(-1)
    if values is None or values.size == 0:
        return default
    return values[0].item() if isinstance(values[0], np.generic) else values[0]  # BYTES are bytes


def _text(text: str) -> Any:
    return pb_utils.InferenceResponse(
        [pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_))]
    )


def _error(message: str, code: Any = None) -> Any:
    """A refusal of the request's inputs (HTTP 400), unless `code` says otherwise."""
    error = pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG if code is None else code)
    return pb_utils.InferenceResponse(output_tensors=[], error=error)


def _engine_error(error: Any) -> Any:
    """tensorrt_llm's error, handed on. Triton 2.51's BLS gives every error to the caller as
    INTERNAL, dropping its code; tensorrt_llm's errors are refusals of the request's inputs
    (model.py _error: INVALID_ARG) but for the fault knob's, which stay the server's own (an
    unexpected failure of its execute() would read as a refusal too)."""
    message, code = error.message(), error.code()
    as_sent = code != pb_utils.TritonError.INTERNAL or message.startswith(INJECTED)
    return _error(message, code if as_sent else None)


class Text:
    """One request's generated text as its ids arrive: decoded incrementally, cut after a stop
    word."""

    def __init__(self, pieces: served.Pieces, stop_words: list[str]) -> None:
        self.pieces, self.stop_words = pieces, stop_words
        self.generated = ""
        self.stopped = False

    def add(self, ids: Iterable[int]) -> str:
        """The new text these ids complete (up to and with a stop word; nothing after one)."""
        new = ""
        for token in ids:
            if self.stopped:
                break
            piece = self.pieces(token)
            new += piece
            self.generated += piece
            for word in self.stop_words:
                # Only a match that ends in this piece is new (decoding.Job.end's rule).
                at = self.generated.find(word, max(0, len(self.generated) - len(piece) - len(word) + 1))
                if piece and at >= 0:
                    cut = len(self.generated) - (at + len(word))
                    new, self.generated = new[: len(new) - cut], self.generated[: at + len(word)]
                    self.stopped = True
                    break
        return new


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config["parameters"].items()}
        self.codec = served.codec(params.get("model", ""), os.environ.get("LLMOP_MODEL_DIR", ""))
        self.exclude_input = params["exclude_input_in_output"] == "true"
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.pool = ThreadPoolExecutor(int(config["max_batch_size"]), thread_name_prefix="ensemble")

    def finalize(self) -> None:
        self.pool.shutdown(wait=True)

    def _engine_request(self, request: Any, ids: list[int], stream: bool) -> Any:
        """The tensorrt_llm request: upstream's names, a batch of one; output ids only."""
        inputs = [
            pb_utils.Tensor("input_ids", np.array([ids], dtype=np.int32)),
            pb_utils.Tensor("input_lengths", np.array([[len(ids)]], dtype=np.int32)),
            pb_utils.Tensor("exclude_input_in_output", np.array([[True]])),
            pb_utils.Tensor("streaming", np.array([[stream]])),
        ]
        for name, engine_name in PASSED.items():
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                inputs.append(pb_utils.Tensor(engine_name, tensor.as_numpy()))
        return pb_utils.InferenceRequest(
            model_name=ENGINE, inputs=inputs, requested_output_names=["output_ids", "sequence_length"]
        )

    def _run(self, request: Any, send: Callable[[Any, bool], None]) -> None:
        """Answers the request through send(response, final): streamed, each new text as it
        comes, then the final flag alone (response None); else one response, final. Exactly one
        final, as soon as the answer is complete; the engine's responses after it are drained."""
        prompt = _first(request, "text_input", b"").decode("utf-8", "replace")
        stream = bool(_first(request, "stream", False))
        if not prompt:
            return send(_error("text_input is empty"), True)
        if stream and not self.decoupled:
            return send(_error("stream=true needs a decoupled model (runtime.streaming: true)"), True)
        words = pb_utils.get_input_tensor_by_name(request, "stop_words")
        stop_words = [] if words is None else [w.decode("utf-8", "replace") for w in words.as_numpy().ravel()]
        text = Text(self.codec.pieces(), [w for w in stop_words if w])
        exclude = bool(_first(request, "exclude_input_in_output", self.exclude_input))
        parts = [] if exclude or stream else [prompt]
        finished = False

        def finish(response: Any) -> None:
            nonlocal finished
            if not finished:
                finished = True
                send(response, True)

        engine = self._engine_request(request, self.codec.encode(prompt), stream)
        for response in engine.exec(decoupled=True) if self.decoupled else [engine.exec()]:
            if finished:
                continue  # the engine's request runs on (see above): drained unanswered
            if request.is_cancelled():
                finish(_error("request cancelled", pb_utils.TritonError.CANCELLED))
            elif response.has_error():
                finish(_engine_error(response.error()))
            elif (ids := pb_utils.get_output_tensor_by_name(response, "output_ids")) is not None:
                length = pb_utils.get_output_tensor_by_name(response, "sequence_length").as_numpy()
                new = text.add(ids.as_numpy().reshape(-1)[: int(length.reshape(-1)[0])].tolist())
                if stream and new:
                    send(_text(new), False)
                elif new:
                    parts.append(new)
                if text.stopped:
                    finish(None if stream else _text("".join(parts)))
        finish(None if stream else _text("".join(parts)))

    def _answer(self, request: Any) -> Any:
        """A request's one response (not decoupled)."""
        answered: list[Any] = []
        self._run(request, lambda response, final: answered.append(response))
        return answered[-1]

    def _stream(self, request: Any) -> None:
        """A request of the decoupled model, on a thread of its own; a failure here still ends it."""
        sender = request.get_response_sender()
        finished = False

        def send(response: Any, final: bool) -> None:
            nonlocal finished
            finished = final
            if response is None:
                sender.send(flags=FINAL)
            else:
                sender.send(response, flags=FINAL if final else 0)

        try:
            self._run(request, send)
        except Exception as e:  # no request is left without its final response
            if not finished:
                sender.send(_error(f"ensemble: {e}", pb_utils.TritonError.INTERNAL), flags=FINAL)
            raise

    def execute(self, requests: list[Any]) -> list[Any] | None:
        if self.decoupled:
            for request in requests:
                threading.Thread(target=self._stream, args=(request,), daemon=True).start()
            return None
        return list(self.pool.map(self._answer, requests))
