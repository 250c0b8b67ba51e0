"""A checked request as the body of Triton's generate / generate_stream, for each contract (pure):
the LLM API contract's llmapi model takes text, the engine contract's `tensorrt_llm` the prompt's
ids (docs/architecture.md, "Two GPU contracts, one CPU runtime")."""

from __future__ import annotations

from typing import Any

from llm_operator.frontdoor import structured
from llm_operator.frontdoor.protocol import Generation


def _sampling(gen: Generation) -> dict[str, Any]:
    """The sampling knobs by meaning, None where the client left the engine's default. OpenAI's
    temperature 0 is greedy decoding, which TensorRT-LLM's samplers spell top_k 1; otherwise
    temperature and top_p are always sent (check fills in what the client left out: sampling.py)."""
    greedy = gen.temperature == 0.0
    return {
        "top_k": 1 if greedy else gen.top_k,
        "temperature": None if greedy else gen.temperature,
        "top_p": None if greedy else gen.top_p,
        "seed": gen.seed,
        "presence_penalty": gen.presence_penalty,
        "frequency_penalty": gen.frequency_penalty,
    }


def triton_inputs(
    gen: Generation, backend: str, stream: bool, *, end_id: int | None = None
) -> dict[str, Any]:
    """The body of Triton's generate / generate_stream for this request: the LLM API contract's
    model (pytorch: model_repo_templates/llmapi/tensorrt_llm.pbtxt.j2) takes text and tokenizes it,
    the engine contract's `tensorrt_llm` takes the prompt's ids (engine_inputs)."""
    if backend != "pytorch":
        return engine_inputs(gen, end_id, stream)
    # return_finish_reason: the server's finish_reason is the model's (server._finish).
    body: dict[str, Any] = {"text_input": gen.prompt, "streaming": stream,
                            "sampling_param_max_tokens": gen.max_tokens,
                            "sampling_param_exclude_input_from_output": True,
                            "return_finish_reason": True}  # fmt: skip
    body.update({f"sampling_param_{k}": v for k, v in _sampling(gen).items() if v is not None})
    if gen.stop:
        body["sampling_param_stop"] = gen.stop
    body.update(structured.llmapi_inputs(gen.extras))
    return body


# The engine contract's names for the sampling knobs (inflight_batcher_llm tensorrt_llm/config.pbtxt).
ENGINE_NAMES = {"top_k": "runtime_top_k", "top_p": "runtime_top_p"}


def engine_inputs(gen: Generation, end_id: int | None, stream: bool) -> dict[str, Any]:
    """The engine contract's `tensorrt_llm` model: the prompt's ids in (gen.prompt_ids), ids out
    (frontdoor/choices.py decodes them). ignore_eos is an end id no token has (-1), as TensorRT-LLM's
    own LLM API sends its executor for it (tensorrt_llm/executor/base_worker.py:
    `end_id=-1 if request.sampling_params.ignore_eos`);
    else the tokenizer's end token, which upstream's preprocessing sends too (its END_ID and
    PAD_ID default to the tokenizer's eos). Stop strings are not sent as stop_words_list: the
    front door cuts the text (responses.Stops) and closes the stream, which cancels the request."""
    ids = gen.prompt_ids
    body: dict[str, Any] = {"input_ids": ids, "input_lengths": len(ids), "request_output_len": gen.max_tokens,
                            "exclude_input_in_output": True}  # fmt: skip
    if stream:
        body["streaming"] = True
    sampling = _sampling(gen) | {"min_tokens": gen.min_tokens,
                                 "repetition_penalty": gen.repetition_penalty}  # fmt: skip
    body.update({ENGINE_NAMES.get(k, k): v for k, v in sampling.items() if v is not None})
    body.update(structured.engine_inputs(gen.extras))
    if gen.ignore_eos:
        body["end_id"] = -1
    elif end_id is not None:
        body["end_id"] = body["pad_id"] = end_id
    return body
