"""Triton python-backend model "tensorrt_llm" of the CPU reference runtime on the LLM API contract:
what NVIDIA's llmapi model.py is on GPU pods (NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/
tensorrt_llm/1/model.py), on the decoder and codec the engine contract serves (decoding.py, served.py).

The operator ships this file as the repository's tensorrt_llm/1/base_model.py, under the same
wrapper as GPU pods (runtime/llmapi_model.py, the repository's model.py), so the load gauges come
the same way on both: from the engine's iteration stats. Like upstream's model it
- reads model.yaml (the engine's arguments; triton_config.decoupled) and config.pbtxt's inputs
  `text_input`, `streaming`, the `sampling_param_*` that helpers.py reads (get_sampling_params_from_
  request: max_tokens, temperature, top_k, top_p, frequency/presence penalties, seed, stop,
  exclude_input_from_output) and the `return_*` flags (get_output_config_from_request);
- starts its engine (engine.CpuLLM) on an asyncio loop in a thread of its own, and sets
  `self._llm_engine` and `self._event_loop` once it runs (upstream's _init_engine);
- returns from execute() at once: each request becomes a coroutine on that loop;
- answers with `text_output` the WHOLE text so far in every streamed response, and
  `finish_reason` / `stop_reason` / `cumulative_logprob` when the request's flag asks
  (upstream's _create_response: str() of each);
- spans the ranks of a multi-node group when launch.py started it as rank 0 of several: the model's
  layers split into pipeline stages over them (pipeline.py), as upstream's LLM API spreads its
  pipeline stages over the MPI world trtllm-llmapi-launch starts;
- takes the operator's wrapper's inputs for guided decoding, n and log probabilities and answers
  with its outputs (runtime/llmapi_structured.py), on the engine contract's machinery: xgrammar
  (structured/guided.py), n jobs sampled with seeds seed + i (as upstream's child requests), each
  token's log-probability and its k likeliest; `text_output` has a row per sequence, as upstream's;
- takes a request with the `stop` input true as the end of every request with its request id
  (upstream's handle_stop_request: each is aborted, the stop request answered with a CANCELLED
  error). An aborted request ends with finish_reason "cancelled", as upstream streams it; upstream
  sends an unstreamed one nothing, here it gets that final response too, so it never hangs.

What the engine contract's tensorrt_llm (model.py) has beyond its contract, this model has too
(decoding.py), so every test of the runtime holds on either contract: Triton's
time-to-first-response histogram from the `ttft_buckets_ms` parameter, and the TEST-ONLY fault
knob (faults.py): injected failures counted by Triton (execute raises for them), the LATENCY delay
before a request's final response, the TTFT and STEP delays in the engine's steps (engine.py).

Triton's python stub ignores PYTHONPATH, so, as model.py does, this module first puts the
`python_path` parameter of its config.pbtxt on sys.path.
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

import asyncio  # noqa: E402
import json  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import AsyncIterator  # noqa: E402
from dataclasses import replace  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402
import yaml  # noqa: E402

from llm_operator.runtime.cpu_reference import pipeline, served  # noqa: E402
from llm_operator.runtime.cpu_reference.decoding import (  # noqa: E402
    FirstResponse,
    Job,
    Limits,
    Sampling,
    buckets,
    fault_knob,
    injected,
    job,
)
from llm_operator.runtime.cpu_reference.engine import CpuLLM, Generation, Output, output  # noqa: E402
from llm_operator.runtime.cpu_reference.structured.guided import Matcher, Vocabulary, check_schema  # noqa: E402
from llm_operator.runtime.cpu_reference.tiny_lm import Penalties  # noqa: E402
from llm_operator.runtime.llmapi_structured import Extras, extras, outputs  # noqa: E402

# SamplingParams' default max_tokens (tensorrt_llm/sampling_params.py).
DEFAULT_MAX_TOKENS = 32
# request flag -> (output, the output's field): upstream's _create_response.
OUTPUT_FIELDS = {
    "return_finish_reason": ("finish_reason", "finish_reason"),
    "return_stop_reason": ("stop_reason", "stop_reason"),
    "return_cumulative_logprob": ("cumulative_logprob", "cumulative_logprob"),
}


def _scalar(request: Any, name: str, default: Any) -> Any:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    values = tensor.as_numpy().reshape(-1)
    if values.size != 1:
        raise ValueError(f"{name} must be one value")
    return values[0].item() if isinstance(values[0], np.generic) else values[0]  # BYTES are bytes


def _strings(request: Any, name: str) -> tuple[str, ...]:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return ()
    return tuple(
        v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
        for v in tensor.as_numpy().reshape(-1)
    )


def _error(message: str, code: Any) -> Any:
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message, code))


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config["parameters"].items()}
        llm_args = yaml.safe_load((Path(__file__).parent / "model.yaml").read_text())
        self.decoupled = bool(llm_args["triton_config"]["decoupled"])
        torch.set_num_threads(1)  # as model.py's instances: the same arithmetic, the same answers
        try:
            self.lm, self.codec = served.load(
                params.get("model", ""), int(params["weights_seed"]), os.environ.get("LLMOP_MODEL_DIR", "")
            )
        except ValueError as e:
            raise pb_utils.TritonModelException(str(e)) from None
        world = int(os.environ.get(pipeline.WORLD_ENV) or 1)
        if world > 1:  # rank 0 of a group (launch.py): the other stages run on the other ranks
            identity = {"model": params.get("model", ""), "weights_seed": int(params["weights_seed"]),
                        "model_dir": os.environ.get("LLMOP_MODEL_DIR", "")}  # fmt: skip
            self.lm = pipeline.lead(self.lm, world, identity, os.environ)
        self.vocabulary = Vocabulary.of_model(
            self.codec.tokenizer_file, self.lm.embed.shape[0], self.lm.end_id
        )
        self.limits = Limits(int(params["max_input_len"]), int(params["max_seq_len"]))
        self.first_response = FirstResponse(pb_utils, args, buckets(params["ttft_buckets_ms"]))
        self.faults = fault_knob(pb_utils)
        self.received = 0  # requests this instance was given: the fault knob's counter
        # request id -> its requests in flight, for `stop` (touched on the engine's loop only)
        self._by_id: dict[str, set[Generation]] = {}
        self._init_engine(int(llm_args["max_batch_size"]), bool(llm_args.get("enable_iter_perf_stats")))

    def _init_engine(self, max_batch_size: int, iteration_stats: bool) -> None:
        """The engine on its own asyncio loop, in a thread; returns once both are set."""
        started = threading.Event()
        self._llm_engine: CpuLLM | None = None
        self._shutdown: asyncio.Event | None = None

        async def run() -> None:
            self._event_loop = asyncio.get_running_loop()
            self._shutdown = asyncio.Event()
            self._llm_engine = CpuLLM(
                self.lm,
                max_batch_size,
                self.limits.max_seq_len,
                self._event_loop,
                iteration_stats=iteration_stats,
                faults=self.faults,
            )
            started.set()
            await self._shutdown.wait()

        self._event_thread = threading.Thread(target=asyncio.run, args=(run(),), name="cpu-llm-loop")
        self._event_thread.start()
        started.wait()

    def finalize(self) -> None:
        if self._llm_engine is not None and self._shutdown is not None:
            self._llm_engine.shutdown()
            self._event_loop.call_soon_threadsafe(self._shutdown.set)
            self._event_thread.join()
        if isinstance(self.lm, pipeline.LeaderDecoder):
            self.lm.link.stop()

    def execute(self, requests: list[Any]) -> None:
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        failed = None
        for request in requests:
            n, self.received = self.received, self.received + 1
            if self.faults.fails(n):
                failed = injected(self.faults)
                request.get_response_sender().send(_error(failed, pb_utils.TritonError.INTERNAL), flags=final)
                continue
            coroutine = self._execute_single_request(request, time.monotonic())
            asyncio.run_coroutine_threadsafe(coroutine, self._event_loop)
        if failed:
            # Only a raising execute() makes Triton count a python model's failure
            # (nv_inference_request_failure); the failed request has its answer already.
            raise pb_utils.TritonModelException(failed)

    def _jobs(self, request: Any) -> tuple[list[Job] | str, bool, dict[str, bool], Extras]:
        """(the request's jobs, one per sequence, or why it is refused; streaming; its output flags;
        its extras)."""
        flags = {flag: bool(_scalar(request, flag, False)) for flag in OUTPUT_FIELDS}
        streaming = bool(_scalar(request, "streaming", False))
        extra = extras(lambda name: _scalar(request, name, None))  # ValueError: refused
        if streaming and not self.decoupled:
            return "Streaming is only supported in decoupled mode.", streaming, flags, extra
        grammar = None
        if extra.guide_type:
            if extra.guide_type == "json_schema" and (problem := check_schema(extra.guide)):
                return problem, streaming, flags, extra
            grammar = self.vocabulary.grammar(extra.guide_type, extra.guide)
        prompt = _scalar(request, "text_input", b"")
        sampling = Sampling(
            max_tokens=int(_scalar(request, "sampling_param_max_tokens", DEFAULT_MAX_TOKENS)),
            temperature=float(_scalar(request, "sampling_param_temperature", 1.0)),
            top_k=int(_scalar(request, "sampling_param_top_k", 0)),
            top_p=float(_scalar(request, "sampling_param_top_p", 0.0)),
            seed=int(_scalar(request, "sampling_param_seed", 0)),
            penalties=Penalties(
                presence=float(_scalar(request, "sampling_param_presence_penalty", 0.0)),
                frequency=float(_scalar(request, "sampling_param_frequency_penalty", 0.0)),
            ),
            stop_words=_strings(request, "sampling_param_stop"),
        )
        jobs: list[Job] = []
        for i in range(extra.n):  # sequence i samples with seed + i, as upstream's children
            found = job(
                self.lm,
                self.codec,
                self.limits,
                request,
                prompt.decode("utf-8", "replace") if isinstance(prompt, bytes) else str(prompt),
                replace(sampling, seed=sampling.seed + i),
                stream=streaming,
                # helpers.py's default, False: the prompt, then the answer.
                exclude_input=bool(_scalar(request, "sampling_param_exclude_input_from_output", False)),
                guide=None if grammar is None else Matcher(grammar, self.vocabulary.vocab_size),
                index=i,
            )
            if isinstance(found, str):
                return found, streaming, flags, extra
            logprobs = extra.logprobs is not None
            found.extra["logprob"] = flags["return_cumulative_logprob"] or logprobs
            found.extra["token_logprobs"] = logprobs
            found.top_logprobs = extra.logprobs or 0
            jobs.append(found)
        return jobs, streaming, flags, extra

    async def _execute_single_request(self, request: Any, since: float) -> None:
        sender = request.get_response_sender()
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            if _scalar(request, "stop", False):
                self._stop(request.request_id(), sender)
                return
            found, streaming, flags, extra = self._jobs(request)
        except ValueError as e:
            found, streaming, flags, extra = str(e), False, {}, Extras()
        if isinstance(found, str):
            sender.send(_error(found, pb_utils.TritonError.INVALID_ARG), flags=final)
            return
        assert self._llm_engine is not None
        generations = [self._llm_engine.generate_async(j) for j in found]
        request_id = request.request_id()
        if request_id:  # a `stop` can name it
            self._by_id.setdefault(request_id, set()).update(generations)
        latest = [output(j) for j in found]  # each sequence's, as the LLM API's RequestOutput.outputs
        try:
            async for index, out in _merged(generations):
                latest[index] = out
                done = all(o.finished for o in latest)
                if out.finish_reason == "cancelled" and not found[index].extra.get("aborted"):
                    cancelled = _error("Request cancelled by client", pb_utils.TritonError.CANCELLED)
                    sender.send(cancelled, flags=final)
                    return
                if streaming or done:
                    if done and self.faults.latency_ms:  # TEST-ONLY (faults.py)
                        await asyncio.sleep(self.faults.latency_ms / 1000.0)
                    self.first_response.observe(found[0], since)
                    sender.send(self._response(latest, flags, extra), flags=final if done else 0)
        finally:
            same = self._by_id.get(request_id)
            if same is not None:
                same.difference_update(generations)
                if not same:
                    del self._by_id[request_id]

    def _stop(self, request_id: str, sender: Any) -> None:
        """Abort every request in flight with this request id (upstream's handle_stop_request)."""
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if not request_id:
            # INTERNAL: upstream's TritonError carries no code, and that is its default.
            message = "A request id must be provided for request cancellation"
            sender.send(_error(message, pb_utils.TritonError.INTERNAL), flags=final)
            return
        for generation in self._by_id.pop(request_id, ()):
            generation.abort()
        sender.send(_error("Request cancelled by client", pb_utils.TritonError.CANCELLED), flags=final)

    @staticmethod
    def _response(latest: list[Output], flags: dict[str, bool], extra: Extras) -> Any:
        texts = np.array([o.text.encode("utf-8") for o in latest], dtype=np.object_)
        tensors = [pb_utils.Tensor("text_output", texts)]
        for flag, (name, field) in OUTPUT_FIELDS.items():
            if flags.get(flag):
                values = np.array([str(getattr(o, field)) for o in latest], dtype=np.object_)
                tensors.append(pb_utils.Tensor(name, values))
        tensors += [pb_utils.Tensor(name, value) for name, value in outputs(latest, extra).items()]
        return pb_utils.InferenceResponse(tensors)


async def _merged(generations: list[Generation]) -> AsyncIterator[tuple[int, Output]]:
    """(sequence, output) as each sequence's come, until every one is finished."""
    queue: asyncio.Queue[tuple[int, Output]] = asyncio.Queue()

    async def pump(index: int, generation: Generation) -> None:
        async for out in generation:
            queue.put_nowait((index, out))

    pumps = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(generations)]
    try:
        left = len(generations)
        while left:
            index, out = await queue.get()
            left -= out.finished
            yield index, out
    finally:
        for task in pumps:
            task.cancel()
