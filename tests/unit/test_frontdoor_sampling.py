"""What a request that leaves its sampling out gets (OpenAI's defaults, or the model's
generation_config.json as vLLM applies it), and the engine's finish reasons in OpenAI's terms."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from llm_operator.frontdoor import __main__ as frontdoor_main
from llm_operator.frontdoor import protocol as P
from llm_operator.frontdoor import responses as R
from llm_operator.frontdoor import sampling
from llm_operator.frontdoor import triton_inputs as T
from llm_operator.frontdoor.sampling import Defaults
from llm_operator.runtime.cpu_reference import tokenizer_files

from tests.unit.test_frontdoor_server import STREAM_HEAD, events, exchange, front_door, sse

LIMITS = P.Limits(max_input_len=100, max_seq_len=200)
SAMPLING = ("temperature", "top_p", "top_k", "repetition_penalty")


def inputs(
    backend: str = "tensorrt-engine", defaults: Defaults = sampling.OPENAI, **body: Any
) -> dict[str, Any]:
    gen = P.check({"model": "m", "prompt": "hi", **body}, "completion", LIMITS, backend=backend,
                  defaults=defaults)  # fmt: skip
    gen.prompt, gen.prompt_ids = "hi", [5, 6]
    sent = T.triton_inputs(gen, backend, stream=False)
    if backend == "pytorch":
        return {k.removeprefix("sampling_param_"): v for k, v in sent.items()}
    by_meaning = {name: knob for knob, name in T.ENGINE_NAMES.items()}  # the engine's runtime_top_k, ...
    return {by_meaning.get(k, k): v for k, v in sent.items()}


@pytest.mark.parametrize("backend", ["tensorrt-engine", "cpu-reference", "pytorch"])
def test_an_omitted_temperature_samples_at_openais_1_with_top_p_1_and_a_new_seed(backend: str) -> None:
    """OpenAI's temperature 1, not greedy: top_p 1 is sent too, since TensorRT-LLM's samplers are
    greedy without top_k or top_p; each request draws its own seed (the engines default to 0)."""
    first, second = inputs(backend), inputs(backend)
    assert {k: first.get(k) for k in SAMPLING} == {"temperature": 1.0, "top_p": 1.0, "top_k": None,
                                                   "repetition_penalty": None}  # fmt: skip
    assert isinstance(first["seed"], int) and first["seed"] != second["seed"]
    assert inputs(backend, seed=5)["seed"] == 5
    greedy = inputs(backend, temperature=0)
    assert greedy["top_k"] == 1 and not {"temperature", "top_p", "seed"} & set(greedy)


def test_a_temperature_without_top_p_still_samples() -> None:
    assert {k: inputs(temperature=0.7).get(k) for k in ("temperature", "top_p")} == {
        "temperature": 0.7, "top_p": 1.0}  # fmt: skip


# Llama 3.1 Instruct's generation_config.json, and a Qwen3-like one with top_k and a penalty.
LLAMA31 = {"bos_token_id": 128000, "do_sample": True, "eos_token_id": [128001, 128008, 128009],
           "temperature": 0.6, "top_p": 0.9, "transformers_version": "4.42.3"}  # fmt: skip
QWEN = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}


def test_the_models_generation_config_sets_what_the_request_leaves_out() -> None:
    llama = sampling.from_generation_config(LLAMA31, "llama/generation_config.json")
    assert (llama.temperature, llama.top_p, llama.top_k, llama.repetition_penalty) == (0.6, 0.9, None, None)
    assert llama.source == "llama/generation_config.json"
    qwen = sampling.from_generation_config(QWEN, "q")
    sent = inputs(defaults=qwen)
    assert {k: sent.get(k) for k in SAMPLING} == {"temperature": 0.7, "top_p": 0.8, "top_k": 20,
                                                  "repetition_penalty": 1.05}  # fmt: skip
    # The request's own values win, their neutral ones included.
    mine = inputs(defaults=qwen, temperature=1.2, top_p=1, top_k=0, repetition_penalty=1.0)
    assert {k: mine.get(k) for k in SAMPLING} == {"temperature": 1.2, "top_p": 1.0, "top_k": None,
                                                  "repetition_penalty": None}  # fmt: skip
    assert "top_k" not in inputs(defaults=qwen, top_k=-1)
    assert inputs(defaults=qwen, temperature=0)["top_k"] == 1  # greedy stays greedy
    # The llmapi model has no repetition penalty: the model's is not applied there, nothing refused.
    llmapi = inputs("pytorch", defaults=qwen)
    assert (llmapi["top_k"], llmapi["temperature"], "repetition_penalty" in llmapi) == (20, 0.7, False)


def test_what_transformers_drops_as_its_own_default_vllm_never_sees() -> None:
    """vLLM reads GenerationConfig.to_diff_dict(): a file's top_k 50 (transformers' default) is no
    default; a file with only such values, or none, leaves OpenAI's."""
    only_its_own = {"top_k": 50, "temperature": 1.0, "do_sample": True}
    assert sampling.from_generation_config(only_its_own, "x") == sampling.OPENAI
    assert sampling.from_generation_config({"top_k": 40}, "x").top_k == 40
    assert sampling.from_generation_config({"bos_token_id": 1, "eos_token_id": 2}, "x") == sampling.OPENAI


@pytest.mark.parametrize(
    ("config", "says"),
    [({"temperature": "hot"}, "temperature must be a number"), ({"top_p": 1.5}, "top_p is 1.5"),
     ({"top_k": 2.5}, "top_k is 2.5"), ({"repetition_penalty": 0}, "repetition_penalty is 0"),
     ({"temperature": True}, "temperature must be a number")],
)  # fmt: skip
def test_an_unusable_generation_config_names_the_key(config: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        sampling.from_generation_config(config, "m/generation_config.json")


def test_the_front_door_reads_generation_config_beside_the_tokenizer(tmp_path: Path) -> None:
    assert sampling.load(tmp_path) == sampling.OPENAI
    (tmp_path / "generation_config.json").write_text(json.dumps(QWEN))
    assert sampling.load(tmp_path).top_k == 20
    (tmp_path / "generation_config.json").write_text("{")
    with pytest.raises(ValueError, match=r"generation_config\.json is not valid JSON"):
        sampling.load(tmp_path)


def test_an_unusable_generation_config_stops_the_front_door_with_78(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokenizer_files.write(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_p": 7}))
    env = {"LLMOP_SERVED_MODEL_NAMES": "m", "LLMOP_TOKENIZER_DIR": str(tmp_path)}
    assert frontdoor_main.main(env) == frontdoor_main.EXIT_CONFIG
    assert f"{tmp_path}/generation_config.json: top_p is 7" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("engine", "openai"), [("stop", "stop"), ("length", "length"), ("timeout", "length")]
)
def test_the_llmapi_finish_reasons_in_openais_terms(engine: str, openai: str) -> None:
    assert R.finish_reason(engine) == openai


def test_a_cancellation_or_an_unknown_reason_is_no_answer() -> None:
    with pytest.raises(P.ApiError) as e:
        R.finish_reason("cancelled")
    assert (e.value.status, e.value.code, e.value.kind) == (503, "generation_cancelled", "server_error")
    with pytest.raises(P.ApiError, match="'aborted'") as e:
        R.finish_reason("aborted")
    assert e.value.status == 500


async def cancelled_after_one_token(w: asyncio.StreamWriter) -> None:
    w.write(STREAM_HEAD + sse({"text_output": "a"}) + sse({"text_output": "a", "finish_reason": "cancelled"})
            + b"0\r\n\r\n")  # fmt: skip
    await w.drain()


@pytest.mark.parametrize("stream", [True, False])
def test_an_engine_cancellation_ends_the_answer_with_an_error(tmp_path: Path, stream: bool) -> None:
    """Streamed: the text so far, then an error event and [DONE], never a finish_reason a client
    would take for a whole answer; unstreamed: a 503 the SDKs retry."""

    async def go() -> tuple[int, bytes]:
        async with front_door(cancelled_after_one_token, tmp_path, backend="pytorch") as port:
            return await exchange(port, {"model": "m", "prompt": "hi", "max_tokens": 5, "stream": stream})

    status, raw = asyncio.run(go())
    if not stream:
        assert status == 503, raw
        assert json.loads(raw.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "generation_cancelled"
        return
    sent = events(raw)
    assert status == 200 and sent[-1] == "[DONE]", sent
    assert json.loads(sent[-2])["error"]["code"] == "generation_cancelled"
    reasons = [json.loads(e)["choices"][0]["finish_reason"] for e in sent[:-2]]
    assert set(reasons) == {None} and json.loads(sent[0])["choices"][0]["text"] == "a"
