"""The CPU reference runtime's engine behind the LLM API contract: what TensorRT-LLM's `LLM` is to
NVIDIA's llmapi model, in the shape the operator's wrapper reads (runtime/llmapi_model.py).

Requests queue here (the model's execute() returns at once, as upstream's does); one thread takes
up to max_batch_size of them and decodes them in lockstep (decoding.steps), then the next batch.
Each step is one iteration: with iteration stats on (model.yaml's enable_iter_perf_stats, as on the
PyTorch backend) it records TensorRT-LLM's IterationStats fields for it, measured on its own batch,
which get_stats_async yields as TensorRT-LLM's does (one dict per iteration, the iterator ending
once none came for `timeout` seconds). The TEST-ONLY fault knob's engine delays (faults.py: a slow
prefill, slow steps) land here, as in model.py's decoding.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from llm_operator.runtime.cpu_reference.decoding import TOKENS_PER_BLOCK, Job, blocks, delay, steps
from llm_operator.runtime.cpu_reference.faults import Faults
from llm_operator.runtime.cpu_reference.tiny_lm import Batch, Decoder

# TensorRT-LLM keeps the stats of this many iterations for a reader (iter_stats_max_iterations).
MAX_STATS = 1000


@dataclass(frozen=True)
class Output:
    """A snapshot of one sequence's output: the LLM API's CompletionOutput, and `finished`."""

    text: str  # the whole text so far
    finished: bool
    finish_reason: str | None
    stop_reason: str | None
    cumulative_logprob: float
    # Only for a job that returns log-probabilities (job.extra["token_logprobs"]), as the LLM API's:
    # the generated ids and each one's {id: log-probability} (itself and its alternatives).
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[dict[int, float], ...] = ()


def output(job: Job) -> Output:
    """The job's output now."""
    ids: tuple[int, ...] = ()
    positions: tuple[dict[int, float], ...] = ()
    if job.extra.get("token_logprobs"):
        ids = tuple(job.ids)
        alternatives = job.alternatives or [{}] * len(ids)
        positions = tuple({**a, i: lp} for a, i, lp in zip(alternatives, ids, job.logprobs, strict=False))
    return Output(job.text(), job.done, job.finish_reason, job.stop_reason, job.logprob, ids, positions)


class Generation:
    """One request's outputs, as the LLM API's generate_async result: iterated on the engine's loop;
    abort() ends it with finish_reason "cancelled" at its next token, as the LLM API's abort()."""

    def __init__(self, job: Job, outputs: asyncio.Queue[Output]) -> None:
        self.job, self._outputs, self._finished = job, outputs, False

    def abort(self) -> None:
        self.job.extra["aborted"] = True

    def __aiter__(self) -> Generation:
        return self

    async def __anext__(self) -> Output:
        if self._finished:
            raise StopAsyncIteration
        output = await self._outputs.get()
        self._finished = output.finished
        return output


class CpuLLM:
    def __init__(
        self, lm: Decoder, max_batch_size: int, max_seq_len: int, loop: asyncio.AbstractEventLoop,
        *, iteration_stats: bool, faults: Faults | None = None,
    ) -> None:  # fmt: skip
        self.lm, self.max_batch_size, self.loop = lm, max_batch_size, loop
        self.faults = faults or Faults()
        self.capacity = max_batch_size * blocks(max_seq_len)  # KV blocks: every slot at max_seq_len
        self.iteration_stats = iteration_stats
        self.iteration = 0
        self._stats: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._waiting: deque[tuple[Job, Callable[[Output], None]]] = deque()
        self._wake = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="cpu-llm", daemon=True)
        self._thread.start()

    def generate_async(self, job: Job) -> Generation:
        """The job's outputs: each new text of a streaming job, else its final one only. Called on
        the engine's loop; a job whose request is cancelled or aborted ends with finish_reason
        "cancelled"."""
        outputs: asyncio.Queue[Output] = asyncio.Queue()

        def deliver(output: Output) -> None:  # from the engine's thread
            self.loop.call_soon_threadsafe(outputs.put_nowait, output)

        with self._wake:
            self._waiting.append((job, deliver))
            self._wake.notify()
        return Generation(job, outputs)

    async def get_stats_async(self, timeout: float) -> AsyncIterator[dict[str, Any]]:  # noqa: ASYNC109 (the LLM API's signature)
        while True:
            try:
                yield await asyncio.wait_for(self._stats.get(), timeout)
            except TimeoutError:
                return

    def shutdown(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._waiting and not self._stopped:
                    self._wake.wait()
                if self._stopped:
                    return
                batch = [self._waiting.popleft() for _ in range(min(self.max_batch_size, len(self._waiting)))]
            self._decode(batch)

    def _decode(self, batch: list[tuple[Job, Callable[[Output], None]]]) -> None:
        jobs = [job for job, _ in batch]
        deliver = {id(job): to for job, to in batch}
        first = True

        def before(state: Batch, active: int) -> None:
            nonlocal first
            if self.iteration_stats:
                # Every sequence keeps its KV blocks until the batch ends.
                used = sum(blocks(int(n)) for n in state.lengths)
                self._record(active, context=len(jobs) if first else 0, used_blocks=used)
            # TEST-ONLY (faults.py): a slow prefill, and every sequence's token costing more.
            delay((self.faults.ttft_ms if first else 0.0) + self.faults.step_delay_ms(active))
            first = False

        def emit(job: Job, piece: str) -> None:
            # The client left, or a `stop` request named it: free its slot.
            if not job.done and (job.extra.get("aborted") or job.request.is_cancelled()):
                job.done, job.finish_reason = True, "cancelled"
            if job.done or (job.stream and piece):  # (a token may complete no character yet)
                deliver[id(job)](output(job))

        steps(self.lm, jobs, emit, before, logprobs=any(j.extra.get("logprob") for j in jobs))

    def _record(self, active: int, context: int, used_blocks: int) -> None:
        """One iteration's IterationStats, as TensorRT-LLM serializes them (tests/upstream_names.py)."""
        self.iteration += 1
        stats = {
            "iter": self.iteration,
            "numActiveRequests": active,
            "numQueuedRequests": len(self._waiting),
            "maxNumActiveRequests": self.max_batch_size,
            "inflightBatchingStats": {"numScheduledRequests": active, "numContextRequests": context},
            "kvCacheStats": {
                "maxNumBlocks": self.capacity,
                "freeNumBlocks": self.capacity - used_blocks,
                "usedNumBlocks": used_blocks,
                "tokensPerBlock": TOKENS_PER_BLOCK,
            },
        }
        self.loop.call_soon_threadsafe(self._put, stats)

    def _put(self, stats: dict[str, Any]) -> None:
        if self._stats.qsize() >= MAX_STATS:
            self._stats.get_nowait()  # the oldest goes, as TensorRT-LLM's bounded history
        self._stats.put_nowait(stats)
