"""Triton python-backend model "tensorrt_llm" of the CPU reference runtime on the engine contract,
on the model served.py loads (LLMOP_MODEL_DIR's checkpoint, else the builtin model config.pbtxt
names): TensorRT-LLM's engine contract, token ids in and out (input_ids, input_lengths,
request_output_len, end_id, streaming, the sampling inputs -> output_ids [batch, beam, length],
sequence_length [batch, beam]), as the OpenAI front door calls it on GPUs. Streaming, each response
holds the one new id, as the C++ backend's hold the ids since the previous response; not streaming,
all the generated ids (the prompt's first unless exclude_input_in_output). It is the repository's
only decoder: the text `ensemble` for /v2 clients (ensemble.py) calls it, as on GPUs the ensemble
runs preprocessing -> tensorrt_llm -> postprocessing.

A dynamic batch is decoded in lockstep; in decoupled mode a streaming request gets one response per
token, the last one flagged final, and any request gets its final response as soon as it is done.

It also exports the TensorRT-LLM backend's load gauges under their real names and labels
(nv_trt_llm_request_metrics, nv_trt_llm_kv_cache_block_metrics), measured on its own batches, so
the recording rules and dashboards of GPU pods work on CPU pods too (docs/autoscaling.md), and
Triton's time-to-first-response histogram (nv_inference_first_response_histogram_ms, model and
version labels), which this Triton (2.51) lacks: from Triton 24.11 the core exports it for every
model, with the buckets of the config's model_metrics. Here the buckets come from the
`ttft_buckets_ms` parameter (the operator puts an edge at the canary analysis's TTFT budget, so the
analysis is exact there), and the time runs from the moment the model receives the request, not
from its arrival in Triton: a python backend cannot see its request's wait in Triton's queue
(nv_inference_queue_duration_us has it).

TEST-ONLY: faults.py's knob (LLMOP_FAULT_* environment variables) makes requests fail or slow on
purpose, for canary analysis tests; unset, it does nothing.

The operator ships this file inside the rendered repository (<repo>/tensorrt_llm/1/model.py).
Triton's python stub embeds the system libpython and ignores PYTHONPATH, so before importing
anything beyond the standard library (the stub itself imports numpy right after this module) it
reads the `python_path` parameter of its own config.pbtxt and puts those directories first on
sys.path.
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
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import replace  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from llm_operator.runtime.cpu_reference import served  # noqa: E402
from llm_operator.runtime.cpu_reference.decoding import (  # noqa: E402
    TOKENS_PER_BLOCK,
    FirstResponse,
    Job,
    Limits,
    Sampling,
    blocks,
    buckets,
    delay,
    fault_knob,
    injected,
    job,
    steps,
)
from llm_operator.runtime.cpu_reference.faults import INJECTED  # noqa: E402
from llm_operator.runtime.cpu_reference.structured.guided import Matcher, Vocabulary  # noqa: E402
from llm_operator.runtime.cpu_reference.structured.sequences import extras, result_outputs, step_outputs  # noqa: E402
from llm_operator.runtime.cpu_reference.tiny_lm import Batch, Penalties  # noqa: E402
from llm_operator.runtime.trtllm_metrics import KV_CACHE_BLOCK_METRICS, REQUEST_METRICS, gauges  # noqa: E402


def _optional(request: Any, name: str) -> Any:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy().reshape(-1)


def _first(request: Any, name: str, default: Any) -> Any:
    values = _optional(request, name)
    if values is None or values.size == 0:
        return default
    return values[0].item() if isinstance(values[0], np.generic) else values[0]  # BYTES are bytes


def _response(tensors: dict[str, np.ndarray[Any, Any]]) -> Any:
    return pb_utils.InferenceResponse([pb_utils.Tensor(name, value) for name, value in tensors.items()])


def _error(message: str, code: Any = None) -> Any:
    """An error response for one request (its batch-mates are answered as usual). A refusal of
    the request's inputs (the default) is INVALID_ARG: HTTP 400, gRPC INVALID_ARGUMENT; the
    fault knob's failures stand for the server's own (INTERNAL)."""
    if code is None:
        code = (
            pb_utils.TritonError.INTERNAL
            if message.startswith(INJECTED)
            else pb_utils.TritonError.INVALID_ARG
        )
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message, code))


TOKEN_BUCKETS = [10.0, 50.0, 100.0, 500.0, 1000.0]


class LoadGauges:
    """The TensorRT-LLM backend's request and KV-cache gauges, measured on this instance's batch.
    Triton keeps one series per label set for all instances of the model (one stub process each),
    so every instance moves the shared gauges by the change of its own share, never sets them."""

    def __init__(self, args: dict[str, str], slots: int, blocks_per_slot: int) -> None:
        self.labels = {"model": args["model_name"], "version": args["model_version"]}
        self.families: list[Any] = []  # a family must outlive its metrics
        self.requests = gauges(pb_utils, self.families, self.labels, REQUEST_METRICS)
        self.blocks = gauges(pb_utils, self.families, self.labels, KV_CACHE_BLOCK_METRICS)
        self.shares: dict[str, float] = {}
        self.slots, self.capacity = slots, slots * blocks_per_slot
        self.blocks["tokens_per"].set(TOKENS_PER_BLOCK)
        self.update()
        self.input_tokens = self._histogram("nv_llm_input_token_len", "total_input_tokens")
        self.output_tokens = self._histogram("nv_llm_output_token_len", "total_output_tokens")

    def _histogram(self, name: str, kind: str) -> Any:
        """Token counts of completed requests, as TensorRT-LLM's backend buckets them."""
        family = pb_utils.MetricFamily(name=name, description="TRT LLM response metrics",
                                       kind=pb_utils.MetricFamily.HISTOGRAM)  # fmt: skip
        self.families.append(family)
        return family.Metric(labels={**self.labels, "response_metric_type": kind}, buckets=TOKEN_BUCKETS)

    def completed(self, input_tokens: int, output_tokens: int) -> None:
        self.input_tokens.observe(input_tokens)
        self.output_tokens.observe(output_tokens)

    def _share(self, gauges: dict[str, Any], kind: str, value: float) -> None:
        key = f"{id(gauges)}/{kind}"
        if delta := value - self.shares.get(key, 0.0):
            gauges[kind].increment(delta)
            self.shares[key] = value

    def update(self, active: int = 0, context: int = 0, used_blocks: int = 0) -> None:
        """This instance's requests in its batch (context: in their prefill step) and the blocks
        their tokens occupy. Requests wait in Triton's scheduler, not here (they show in
        nv_inference_pending_request_count), so `waiting` stays 0 as the backend's would."""
        self._share(self.requests, "max", self.slots)
        self._share(self.requests, "active", active)
        self._share(self.requests, "scheduled", active)
        self._share(self.requests, "context", context)
        self._share(self.blocks, "max", self.capacity)
        self._share(self.blocks, "used", used_blocks)
        self._share(self.blocks, "free", self.capacity - used_blocks)
        total = self.blocks["max"].value()
        self.blocks["fraction"].set(self.blocks["used"].value() / total if total else 0.0)

    def close(self) -> None:
        """Take this instance's share out (model unload)."""
        self.slots = self.capacity = 0
        self.update()


def _raise_injected(checked: list[list[Job] | str]) -> None:
    """Fail the batch if the fault knob failed one of its requests. Triton's python backend
    reports every request of a batch a success, error responses included, unless execute raises:
    only then is nv_inference_request_failure counted (for the whole batch)."""
    for outcome in checked:
        if isinstance(outcome, str) and outcome.startswith(INJECTED):
            raise pb_utils.TritonModelException(outcome)


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config["parameters"].items()}
        # One thread per instance: Triton's instance count is the unit of CPU parallelism.
        torch.set_num_threads(1)
        try:
            self.lm, self.codec = served.load(
                params.get("model", ""), int(params["weights_seed"]), os.environ.get("LLMOP_MODEL_DIR", "")
            )
        except ValueError as e:
            raise pb_utils.TritonModelException(str(e)) from None
        self.vocabulary = Vocabulary.of_model(
            self.codec.tokenizer_file, self.lm.embed.shape[0], self.lm.end_id
        )
        self.limits = Limits(int(params["max_input_len"]), int(params["max_seq_len"]))
        self.exclude_input = params["exclude_input_in_output"] == "true"
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.load = LoadGauges(args, int(config["max_batch_size"]), blocks(self.limits.max_seq_len))
        self.first_response = FirstResponse(pb_utils, args, buckets(params["ttft_buckets_ms"]))
        self.faults = fault_knob(pb_utils)
        self.received = 0  # requests this instance was given: the fault knob's counter

    def finalize(self) -> None:
        self.load.close()

    def _admit(self, request: Any) -> list[Job] | str:
        """The request's jobs (one per sequence), or why it is refused (or fails on purpose: faults.py)."""
        n, self.received = self.received, self.received + 1
        if self.faults.fails(n):
            return injected(self.faults)
        return self._job(request)

    def _job(self, request: Any) -> list[Job] | str:
        """The request's jobs (decoding.job, one per sequence: sequences.py), read from upstream's
        inputs."""
        extra = extras(lambda name, default: _first(request, name, default), self.decoupled)
        if isinstance(extra, str):
            return extra
        grammar = None
        if extra.guide_type:
            try:
                grammar = self.vocabulary.grammar(extra.guide_type, extra.guide)
            except ValueError as e:
                return str(e)
        stream = bool(_first(request, "streaming", False))
        if stream and not self.decoupled:
            return "streaming=true needs a decoupled model (runtime.streaming: true)"
        end_id = self.lm.end_id
        sampling = Sampling(
            max_tokens=int(_first(request, "request_output_len", 0)),
            temperature=float(_first(request, "temperature", 1.0)),
            top_k=int(_first(request, "runtime_top_k", 0)),
            top_p=float(_first(request, "runtime_top_p", 0.0)),
            seed=int(_first(request, "seed", 0)),
            penalties=Penalties(
                repetition=float(_first(request, "repetition_penalty", 1.0)),
                presence=float(_first(request, "presence_penalty", 0.0)),
                frequency=float(_first(request, "frequency_penalty", 0.0)),
            ),
            min_tokens=int(_first(request, "min_tokens", 0)),
            # end_id -1 (ignore_eos) never ends.
            ignore_end=int(_first(request, "end_id", end_id if end_id is not None else -1)) == -1,
        )
        given = _optional(request, "input_ids")
        prompt = [int(i) for i in given] if given is not None else []
        prompt = prompt[: int(_first(request, "input_lengths", len(prompt)))]
        exclude = bool(_first(request, "exclude_input_in_output", self.exclude_input))
        jobs: list[Job] = []
        for i in range(extra.sequences):  # sequence i samples with seed + i, as upstream's children
            guide = None if grammar is None else Matcher(grammar, self.vocabulary.vocab_size)
            knobs = replace(sampling, seed=sampling.seed + i)
            one = job(self.lm, self.codec, self.limits, request, prompt, knobs,
                      stream=stream, exclude_input=exclude, guide=guide, index=i)  # fmt: skip
            if isinstance(one, str):
                return one
            one.extra["log_probs"], one.extra["sequences"] = extra.log_probs, extra.sequences
            jobs.append(one)
        return jobs

    def _decode(self, jobs: list[Job], emit: Callable[[Job, str], None]) -> None:
        """emit(job, piece) sees every token. The load gauges follow the batch: every sequence
        keeps its KV cache until the batch ends."""
        prompts = [j.prompt_ids for j in jobs]
        # The prefill (context phase) starts with the prompts' blocks taken, as in TensorRT-LLM.
        self.load.update(len(jobs), context=len(jobs), used_blocks=sum(blocks(len(p)) for p in prompts))

        def before(batch: Batch, active: int) -> None:
            self.load.update(active=active, used_blocks=sum(blocks(int(n)) for n in batch.lengths))
            delay(self.faults.step_delay_ms(active))  # a slower engine: every sequence's token costs more

        try:
            delay(self.faults.ttft_ms)  # a slow prefill
            steps(self.lm, jobs, emit, before, logprobs=any(j.extra["log_probs"] for j in jobs))
        finally:
            self.load.update()
        for job_, prompt in zip(jobs, prompts, strict=True):
            self.load.completed(len(prompt), job_.tokens)

    def _result(self, job: Job) -> Any:
        """A sequence's whole answer."""
        return _response(result_outputs(job, job.extra["sequences"]))

    def _step(self, job: Job) -> Any:
        """A streaming sequence's new tokens."""
        return _response(step_outputs(job, job.extra["sequences"]))

    def execute(self, requests: list[Any]) -> list[Any] | None:
        started = time.monotonic()
        checked = [self._admit(r) for r in requests]
        groups = [g for g in checked if isinstance(g, list)]
        jobs = [j for g in groups for j in g]
        if not self.decoupled:  # one sequence per request (sequences.extras)
            if jobs:
                self._decode(jobs, lambda job, piece: None)
                delay(self.faults.latency_ms)
            _raise_injected(checked)  # the whole batch fails with it
            for job in jobs:
                self.first_response.observe(job, started)
            return [_error(g) if isinstance(g, str) else self._result(g[0]) for g in checked]

        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        for request, refusal in zip(requests, checked, strict=True):
            if isinstance(refusal, str):
                request.get_response_sender().send(_error(refusal), flags=final)
        senders = {id(g[0].request): g[0].request.get_response_sender() for g in groups}
        group_of = {id(j): g for g in groups for j in g}
        held: list[tuple[Job, Any, int]] = []  # final responses the fault knob delays

        def send(job: Job, response: Any, flags: int) -> None:
            self.first_response.observe(group_of[id(job)][0], started)
            senders[id(job.request)].send(response, flags=flags)

        def emit(job: Job, piece: str) -> None:
            group = group_of[id(job)]
            if job.request.is_cancelled():  # the client left: free its sequences' slots
                for sibling in group:
                    sibling.done = True
                senders[id(job.request)].send(
                    _error("request cancelled", pb_utils.TritonError.CANCELLED), flags=final
                )
                return
            # The final flag comes once every sequence of the request is done.
            flags = final if all(j.done for j in group) else 0
            if job.done and self.faults.latency_ms:
                held.append((job, self._step(job) if job.stream else self._result(job), flags))
            elif job.stream:
                send(job, self._step(job), flags)
            elif job.done:
                send(job, self._result(job), flags)

        if jobs:
            self._decode(jobs, emit)
        if held:
            delay(self.faults.latency_ms)
            for job, response, flags in held:
                send(job, response, flags)
        _raise_injected(checked)  # its other requests have their answers already
        return None
