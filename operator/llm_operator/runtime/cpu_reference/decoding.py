"""What both Triton contracts of the CPU reference runtime share: a request's job, checked as
TensorRT-LLM checks it, and the lockstep decoding of a batch of jobs. The engine contract's decoder
(model.py: `tensorrt_llm`, ids in and out, which the text `ensemble` calls) and the LLM API model
(llmapi.py and engine.py) differ only in how requests arrive and answers leave. Both also add, so
that every test of the runtime holds on either: Triton's time-to-first-response histogram
(FirstResponse), and the TEST-ONLY fault knob (faults.py: fault_knob, injected, delay). Their
callers pass triton_python_backend_utils, which only Triton's python stub imports."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from llm_operator.runtime.cpu_reference.faults import ERROR_PERCENT, INJECTED, Faults
from llm_operator.runtime.cpu_reference.served import Codec, Pieces
from llm_operator.runtime.cpu_reference.structured.guided import Matcher
from llm_operator.runtime.cpu_reference.tiny_lm import Batch, Decoder, Penalties, Sampler

# TensorRT-LLM's paged KV cache hands out blocks of this many tokens (trtllm-build's default).
TOKENS_PER_BLOCK = 32


def blocks(tokens: int) -> int:
    return -(-tokens // TOKENS_PER_BLOCK)


@dataclass
class Job:
    """One request of the batch being decoded."""

    request: Any
    prompt: str
    prompt_ids: list[int]
    max_tokens: int
    stream: bool
    exclude_input: bool
    stop_words: list[str]
    sampler: Sampler
    pieces: Pieces  # its output's text, token by token
    generated: str = ""
    ids: list[int] = field(default_factory=list)  # generated
    tokens: int = 0  # generated
    done: bool = False
    answered: bool = False  # its first response is sent (time to first token observed)
    finish_reason: str | None = None  # the LLM API's: "stop", "length" or "cancelled"
    stop_reason: str | None = None  # the stop word that ended it
    logprob: float = 0.0  # cumulative log-probability of its tokens (the model's distribution)
    logprobs: list[float] = field(default_factory=list)  # each generated token's, when computed
    top_logprobs: int = 0  # k: each position's k likeliest ids go into `alternatives` (logprobs on)
    alternatives: list[dict[int, float]] = field(default_factory=list)
    index: int = 0  # its sequence among the request's num_return_sequences
    sent: int = 0  # generated ids already streamed
    extra: dict[str, Any] = field(default_factory=dict)  # the contract's own per-request state

    def text(self) -> str:
        return self.generated if self.exclude_input else self.prompt + self.generated

    def end(self, token: int, piece: str) -> None:
        """After its newest token: whether (and why) it is done. A stop word ends in the new piece."""
        if token == self.sampler.end_id:
            self.finish_reason = "stop"
        elif word := next(
            (w for w in self.stop_words if piece and w in self.generated[1 - len(w) - len(piece) :]), None
        ):
            self.finish_reason, self.stop_reason = "stop", word
        elif self.tokens >= self.max_tokens:
            self.finish_reason = "length"
        self.done = self.finish_reason is not None


@dataclass(frozen=True)
class Limits:
    max_input_len: int
    max_seq_len: int


@dataclass(frozen=True)
class Sampling:
    """A request's generation knobs, by meaning (each contract reads them under its own names)."""

    max_tokens: int
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 0.0
    seed: int = 0
    penalties: Penalties = field(default_factory=Penalties)
    min_tokens: int = 0
    ignore_end: bool = False  # end_id -1: never ends on the end token
    stop_words: tuple[str, ...] = ()


def job(
    lm: Decoder, codec: Codec, limits: Limits, request: Any, prompt: str | list[int], s: Sampling, *,
    stream: bool, exclude_input: bool, guide: Matcher | None = None, index: int = 0,
) -> Job | str:  # fmt: skip
    """The request's job, or why it is refused (TensorRT-LLM refuses the same requests). `prompt`:
    text (encoded with the codec) or token ids (the engine contract's input_ids); `guide`: its
    sequence's place in the request's grammar (guided.py); `index`: its sequence's."""
    prompt_ids = codec.encode(prompt) if isinstance(prompt, str) else prompt
    tokens = len(prompt_ids)
    if not tokens:
        return "text_input is empty" if isinstance(prompt, str) else "input_ids is empty"
    vocab = lm.embed.shape[0]
    if any(not 0 <= i < vocab for i in prompt_ids):  # as the executor's checkTokenIdRange
        return f"input_ids must lie in [0, {vocab}), the model's vocabulary"
    if tokens > limits.max_input_len:
        return f"prompt has {tokens} tokens, more than max_input_len {limits.max_input_len}"
    if s.max_tokens < 1 or tokens + s.max_tokens > limits.max_seq_len:
        return f"max_tokens must be 1..{limits.max_seq_len - tokens} for this prompt (max_seq_len)"
    problem = Sampler.problem(s.temperature, s.top_k, s.top_p) or s.penalties.problem()
    if problem is not None:
        return problem
    if s.min_tokens < 0:
        return "min_tokens must be >= 0"
    # min_tokens keeps the end token off until then. TinyLM has no end token: its every output
    # runs to max_tokens or a stop word.
    return Job(
        request=request,
        prompt=prompt if isinstance(prompt, str) else "",
        prompt_ids=prompt_ids,
        max_tokens=s.max_tokens,
        stream=stream,
        exclude_input=exclude_input,
        stop_words=[w for w in s.stop_words if w],
        sampler=Sampler(
            temperature=s.temperature,
            top_k=s.top_k,
            top_p=s.top_p,
            seed=s.seed,
            penalties=s.penalties,
            prompt=tuple(prompt_ids),
            pickable=lm.pickable,
            end_id=None if s.ignore_end else lm.end_id,
            min_tokens=s.min_tokens,
            guide=guide,
        ),
        pieces=codec.pieces(),
        index=index,
    )


def steps(
    lm: Decoder, jobs: list[Job], emit: Callable[[Job, str], None], before: Callable[[Batch, int], None],
    *, logprobs: bool = False,
) -> None:  # fmt: skip
    """Decode `jobs` in lockstep until each is done: emit(job, piece) sees every token (a done
    job's last one flagged by job.done; a guided job whose grammar left nothing to pick ends "stop"
    with no new token), before(batch, active) runs ahead of each step. `logprobs`: each token's
    log-probability under the model's own distribution (log_softmax of its logits, before the
    sampling knobs and the guide's mask) goes into job.logprobs and job.logprob, and the k likeliest
    of the same row into job.alternatives for a job with top_logprobs k."""
    batch = lm.start([j.prompt_ids for j in jobs])
    while True:
        before(batch, sum(not j.done for j in jobs))
        tokens = batch.pick([j.sampler for j in jobs])
        if logprobs:
            logs = torch.log_softmax(batch.logits, dim=-1)
        for i, (j, token) in enumerate(zip(jobs, tokens, strict=True)):
            if j.done:
                continue
            if j.sampler.exhausted:
                piece, j.done, j.finish_reason = "", True, "stop"
            else:
                piece = j.pieces(token)
                j.generated += piece
                j.ids.append(token)
                j.tokens += 1
                if logprobs:
                    j.logprobs.append(float(logs[i, token]))
                    j.logprob += j.logprobs[-1]
                    if j.top_logprobs:
                        values, ids = logs[i].topk(j.top_logprobs)
                        j.alternatives.append(dict(zip(ids.tolist(), values.tolist(), strict=True)))
                j.end(token, piece)
            if j.done:
                j.sampler.guide = None  # a done job's rows are still picked, unguided
            emit(j, piece)
        if all(j.done for j in jobs):
            return
        batch.advance(tokens)


class FirstResponse:
    """nv_inference_first_response_histogram_ms{model, version}: milliseconds from the request
    reaching this model to its first response. Remove it when the CPU image moves to Triton >=
    24.11: the core then registers the same family itself (histogram_latencies=true)."""

    def __init__(self, pb_utils: Any, args: dict[str, str], buckets: list[float]) -> None:
        self.family = pb_utils.MetricFamily(
            name="nv_inference_first_response_histogram_ms",
            description="Duration from request to first response in milliseconds",
            kind=pb_utils.MetricFamily.HISTOGRAM,
        )
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.metric = self.family.Metric(labels=labels, buckets=buckets)

    def observe(self, job: Job, since: float) -> None:
        if not job.answered:
            job.answered = True
            self.metric.observe((time.monotonic() - since) * 1000.0)


def buckets(parameter: str) -> list[float]:
    """The `ttft_buckets_ms` parameter the operator renders: comma-separated edges."""
    return [float(b) for b in parameter.split(",")]


def fault_knob(pb_utils: Any) -> Faults:
    """This pod's fault knob; a bad setting fails the model's load, naming the variable."""
    try:
        faults = Faults.from_env(os.environ, socket.gethostname())
    except ValueError as e:
        raise pb_utils.TritonModelException(str(e)) from None
    if faults.active:
        pb_utils.Logger.log_warn(f"TEST-ONLY fault knob on: {faults.describe()}")
    return faults


def injected(faults: Faults) -> str:
    return f"{INJECTED} ({ERROR_PERCENT}={faults.error_percent:g}, test only)"


def delay(milliseconds: float) -> None:
    if milliseconds:
        time.sleep(milliseconds / 1000.0)
