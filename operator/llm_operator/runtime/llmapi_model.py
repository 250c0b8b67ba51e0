"""Triton's llmapi model `tensorrt_llm` with the TensorRT-LLM C++ backend's load gauges.

The operator ships this file as the repository's tensorrt_llm/1/model.py, with trtllm_metrics.py
beside it; base_model.py beside them is the model that serves requests: on GPU pods NVIDIA's
llmapi model.py from the serving image (NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/
tensorrt_llm/1/model.py, copied there by the launcher), on CPU pods the CPU reference runtime's
(runtime/cpu_reference/llmapi.py). Upstream's model exports no load gauges and its execute()
returns at once (Triton's pending count stays near 0), so the autoscaler, the drain and the
endpoint picker would see nothing: this subclass reads TensorRT-LLM's iteration stats
(`LLM.get_stats_async`, which needs `enable_iter_perf_stats: true` in model.yaml) and sets the C++
backend's gauges under their names (trtllm_metrics.py). Request handling stays upstream's.

What it relies on in the base (tests/upstream_names.py pins it): class TritonPythonModel,
initialize()/finalize(), and on rank 0 `_llm_engine` (the LLM) and `_event_loop` (the asyncio loop
the engine runs on, in its own thread), which upstream's _run_llm_engine sets before initialize()
returns. get_stats_async(timeout) is an async iterator of one dict per iteration that ends once
no new stats arrived for `timeout` seconds (tensorrt_llm/executor/result.py IterationResult
__anext__) or at once when none were ever produced; it is polled on the engine's loop, as
trtllm-serve's /metrics reads it (tensorrt_llm/serve/openai_server.py).

Standard library and triton_python_backend_utils only: the serving image has no llm_operator.
"""

# base_model first: on CPU pods it puts the python_path of config.pbtxt on sys.path, where
# triton_python_backend_utils finds numpy.
from base_model import TritonPythonModel as BaseModel  # isort: skip

import asyncio
from concurrent.futures import Future
from typing import Any

import triton_python_backend_utils as pb_utils
from trtllm_metrics import IterationGauges

# get_stats_async's own default, and what trtllm-serve's /metrics passes.
STATS_TIMEOUT_S = 2.0
# Between polls that found the stats drained: the gauges are at most this much older.
POLL_PAUSE_S = 1.0


class TritonPythonModel(BaseModel):  # type: ignore[misc]
    def initialize(self, args: dict[str, str]) -> None:
        super().initialize(args)
        self._stats_poll: Future[None] | None = None
        engine, loop = getattr(self, "_llm_engine", None), getattr(self, "_event_loop", None)
        if engine is None or loop is None:  # ranks > 0 wait for rank 0's engine: no stats here
            return
        self._gauges = IterationGauges(pb_utils, args["model_name"], args["model_version"])
        self._stats_poll = asyncio.run_coroutine_threadsafe(self._poll_stats(engine), loop)

    async def _poll_stats(self, engine: Any) -> None:
        failed = False
        while True:
            seen = False
            try:
                async for stats in engine.get_stats_async(STATS_TIMEOUT_S):
                    self._gauges.update(stats)
                    seen = True
            except Exception as e:  # a bad poll must not end the gauges (cancellation still does)
                if not failed:
                    pb_utils.Logger.log_warn(f"[llm-operator] iteration stats unreadable: {e!r}")
                failed = True
            if not seen:
                self._gauges.idle()
            await asyncio.sleep(POLL_PAUSE_S)

    def finalize(self) -> None:
        if getattr(self, "_stats_poll", None) is not None:
            self._stats_poll.cancel()  # type: ignore[union-attr]
        finalize = getattr(super(), "finalize", None)
        if finalize is not None:
            finalize()
