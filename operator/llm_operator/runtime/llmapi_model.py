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

It also adds guided decoding, n and log probabilities, which upstream's model does not read though
the LLM API has them (llmapi_structured.py, beside it, names the inputs and outputs): its
_convert_request(request) returns (prompt, sampling_params, streaming, output_config), with
sampling_params the keyword arguments of SamplingParams, and its _create_response(request_output,
output_config) the response; the overrides add to both, and carry the request's extras from one to
the other in output_config. On CPU pods the base model reads the same inputs itself.

Standard library and triton_python_backend_utils only: the serving image has no llm_operator.
"""

# base_model first: on CPU pods it puts the python_path of config.pbtxt on sys.path, where
# triton_python_backend_utils finds numpy.
from base_model import TritonPythonModel as BaseModel  # isort: skip

import asyncio
from concurrent.futures import Future
from typing import Any

import triton_python_backend_utils as pb_utils
from llmapi_structured import Extras, extras, outputs
from trtllm_metrics import IterationGauges

# get_stats_async's own default, and what trtllm-serve's /metrics passes.
STATS_TIMEOUT_S = 2.0
# Between polls that found the stats drained: the gauges are at most this much older.
POLL_PAUSE_S = 1.0
# output_config's key for the request's extras (upstream's keys are the return_* flags).
EXTRAS = "llm_operator_extras"


def _scalar(request: Any, name: str) -> Any:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy().reshape(-1)[0]


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

    def _convert_request(self, request: Any) -> tuple[Any, dict[str, Any], bool, dict[str, Any]]:
        prompt, sampling_params, streaming, output_config = super()._convert_request(request)
        try:
            extra = extras(lambda name: _scalar(request, name))
        except ValueError as e:
            raise pb_utils.TritonModelException(str(e)) from None
        sampling_params.update(extra.sampling_params())
        guide = extra.guided_decoding_params()
        if guide is not None:  # model.yaml's guided_decoding_backend compiles it
            from tensorrt_llm.sampling_params import GuidedDecodingParams

            sampling_params["guided_decoding"] = GuidedDecodingParams(**guide)
        output_config[EXTRAS] = extra
        return prompt, sampling_params, streaming, output_config

    def _create_response(self, request_output: Any, output_config: dict[str, Any]) -> Any:
        response = super()._create_response(request_output, output_config)
        tensors = outputs(request_output.outputs, output_config.get(EXTRAS, Extras()))
        if not tensors:
            return response
        added = [pb_utils.Tensor(name, value) for name, value in tensors.items()]
        return pb_utils.InferenceResponse(output_tensors=response.output_tensors() + added)

    def finalize(self) -> None:
        if getattr(self, "_stats_poll", None) is not None:
            self._stats_poll.cancel()  # type: ignore[union-attr]
        finalize = getattr(super(), "finalize", None)
        if finalize is not None:
            finalize()
