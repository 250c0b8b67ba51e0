"""The rendered repository of each backend against upstream's own names (tests/upstream_names.py,
pinned from the files of the default release): every tensor and parameter the operator emits
exists upstream with the same data type, and everything upstream requires is emitted. A template
that drifts from the release, or a release that renames what the templates use, fails here."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import text_format
from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.contract import XGRAMMAR_TOKENIZER_INFO, XGRAMMAR_TOKENIZER_INFO_KEYS
from llm_operator.engine import build, tokenizer_info
from llm_operator.frontdoor import structured as S
from llm_operator.modelrepo import render_repository
from llm_operator.plan.types import PoolPlan
from llm_operator.runtime.trtllm_metrics import KV_CACHE_BLOCK_METRICS, REQUEST_METRICS, from_iteration_stats
from tritonclient.grpc import model_config_pb2

from tests import upstream_names as up

REPO = Path(__file__).resolve().parents[2]

POOL = PoolPlan("main", "NVIDIA-H100-80GB-HBM3", ("NVIDIA-H100-80GB-HBM3",), (9, 0), 81559, 2, 1, 2, 1, 1)
TYPE = model_config_pb2.DataType.Name


def spec(backend: str, uri: str) -> LLMDeploymentSpec:
    cache = {"cache": {"claimName": "c"}} if uri.startswith("hf://") else {}
    return LLMDeploymentSpec.model_validate(
        {
            "model": {"name": "m", "source": {"uri": uri}, **cache},
            "engine": {"backend": backend, "precision": "bf16"},
        }
    )


def configs(files: dict[str, str]) -> dict[str, model_config_pb2.ModelConfig]:
    return {
        path.split("/")[0]: text_format.Parse(text, model_config_pb2.ModelConfig())
        for path, text in files.items()
        if path.endswith("/config.pbtxt")
    }


def held_against(
    cfg: model_config_pb2.ModelConfig, inputs: up.Inputs, outputs: up.Outputs, parameters: frozenset[str]
) -> list[str]:
    """What `cfg` declares that upstream does not, or declares with another data type."""
    wrong = []
    for tensor in cfg.input:
        if tensor.name not in inputs:
            wrong.append(f"input {tensor.name} is not upstream's")
        elif inputs[tensor.name][0] not in (None, TYPE(tensor.data_type)):
            wrong.append(
                f"input {tensor.name} is {TYPE(tensor.data_type)}, upstream {inputs[tensor.name][0]}"
            )
        elif tensor.optional != inputs[tensor.name][1]:
            wrong.append(
                f"input {tensor.name}: optional is {tensor.optional}, upstream {inputs[tensor.name][1]}"
            )
    for tensor in cfg.output:
        if tensor.name not in outputs:
            wrong.append(f"output {tensor.name} is not upstream's")
        elif outputs[tensor.name] not in (None, TYPE(tensor.data_type)):
            wrong.append(f"output {tensor.name} is {TYPE(tensor.data_type)}, upstream {outputs[tensor.name]}")
    wrong += [f"parameter {key} is not upstream's" for key in cfg.parameters if key not in parameters]
    return wrong


def missing(cfg: model_config_pb2.ModelConfig, inputs: up.Inputs, required: frozenset[str]) -> list[str]:
    """What upstream requires that `cfg` leaves out: non-optional inputs, required parameters."""
    declared = {t.name for t in cfg.input}
    return [f"input {n}" for n, (_, optional) in inputs.items() if not optional and n not in declared] + [
        f"parameter {key}" for key in sorted(required) if key not in cfg.parameters
    ]


def test_inflight_batcher_llm_uses_only_upstream_names_and_all_it_requires() -> None:
    files = render_repository(
        spec("tensorrt-engine", "pvc://models/m"), POOL, engine_dir="/e", tokenizer_dir="/e/t"
    )
    rendered = configs(files)
    assert set(rendered) == set(up.INFLIGHT_BATCHER_LLM)
    for model, (inputs, outputs, parameters) in up.INFLIGHT_BATCHER_LLM.items():
        cfg = rendered[model]
        assert held_against(cfg, inputs, outputs, parameters) == [], model
        assert missing(cfg, inputs, up.REQUIRED_PARAMETERS.get(model, frozenset())) == [], model


def test_the_ensemble_maps_only_tensors_its_steps_declare() -> None:
    """Every input_map/output_map key of an ensemble step is a tensor of that model upstream."""
    files = render_repository(
        spec("tensorrt-engine", "pvc://models/m"), POOL, engine_dir="/e", tokenizer_dir="/e/t"
    )
    ensemble = configs(files)["ensemble"]
    for step in ensemble.ensemble_scheduling.step:
        inputs, outputs, _ = up.INFLIGHT_BATCHER_LLM[step.model_name]
        assert set(step.input_map) <= set(inputs), step.model_name
        assert set(step.output_map) <= set(outputs), step.model_name


def test_the_ensemble_accepts_the_spellings_upstream_accepts_at_the_tag() -> None:
    """seed and min_tokens; v1.1.0's ensemble has no random_seed or min_length (docs/api.md)."""
    files = render_repository(
        spec("tensorrt-engine", "pvc://models/m"), POOL, engine_dir="/e", tokenizer_dir="/e/t"
    )
    names = {t.name for t in configs(files)["ensemble"].input}
    assert {"seed", "min_tokens"} <= names
    assert not {"random_seed", "min_length"} & (names | set(up.ENSEMBLE_INPUTS))


def test_the_engine_contract_configures_upstreams_guided_decoder() -> None:
    """tensorrt_llm takes the two guide inputs (and the ensemble hands them on) and turns xgrammar on
    over the file the build writes beside the engine, by the names and the script read upstream;
    the front door sends only guide types the backend maps (another runs unguided there)."""
    files = render_repository(
        spec("tensorrt-engine", "pvc://models/m"), POOL, engine_dir="/e", tokenizer_dir="/e/t"
    )
    rendered = configs(files)
    guides = {"guided_decoding_guide_type", "guided_decoding_guide"}
    for model in ("tensorrt_llm", "ensemble"):
        assert guides <= {t.name for t in rendered[model].input}, model
    (step,) = [s for s in rendered["ensemble"].ensemble_scheduling.step if s.model_name == "tensorrt_llm"]
    assert {k: step.input_map[k] for k in guides} == {k: k for k in guides}
    parameters = {k: v.string_value for k, v in rendered["tensorrt_llm"].parameters.items()}
    assert parameters["guided_decoding_backend"] in up.GUIDED_DECODING_BACKENDS
    assert parameters["xgrammar_tokenizer_info_path"] == f"/e/{up.XGRAMMAR_TOKENIZER_INFO_FILE}"
    assert XGRAMMAR_TOKENIZER_INFO == up.XGRAMMAR_TOKENIZER_INFO_FILE
    # The file's check (build, launcher, front door) asks for what the backend reads.
    assert set(XGRAMMAR_TOKENIZER_INFO_KEYS) == up.XGRAMMAR_TOKENIZER_INFO_KEYS
    # What the build runs: upstream's script, where the images keep it, with its own options.
    command = build.tokenizer_info_command("/m", "/e", build.Examples([build.IMAGE_EXAMPLES], required=False))
    assert command[1] == f"/app/examples/{up.XGRAMMAR_TOKENIZER_INFO_SCRIPT}"
    assert command[2:] == ["--model_dir", "/m", "--output_dir", f"/e/{tokenizer_info.SCRATCH}"]
    # The front door's guides (structured.py, tools/request.py): json and json_schema.
    formats = ({"type": "json_object"}, {"type": "json_schema", "json_schema": {"schema": {}}})
    kinds = {S.extras({"response_format": f}, "chat", "tensorrt-engine").guide_type for f in formats}
    assert kinds <= up.GUIDE_TYPES


@pytest.mark.parametrize("uri", ["pvc://models/llama", "hf://meta-llama/Llama-3.1-8B-Instruct"])
def test_llmapi_uses_only_upstream_names_and_all_it_requires(uri: str) -> None:
    files = render_repository(spec("pytorch", uri), POOL, engine_dir="", tokenizer_dir="", model_dir="/m")
    # model.py: the operator's wrapper over upstream's (base_model.py, from the image).
    assert set(files) == {"tensorrt_llm/config.pbtxt", "tensorrt_llm/1/model.yaml", "tensorrt_llm/1/model.py",
                          "tensorrt_llm/1/trtllm_metrics.py",
                          "tensorrt_llm/1/llmapi_structured.py"}  # fmt: skip
    cfg = configs(files)["tensorrt_llm"]
    inputs, outputs = (
        up.LLMAPI_INPUTS | up.LLMAPI_WRAPPER_INPUTS,
        up.LLMAPI_OUTPUTS | up.LLMAPI_WRAPPER_OUTPUTS,
    )
    assert held_against(cfg, inputs, outputs, up.LLMAPI_PARAMETERS) == []
    assert missing(cfg, inputs, frozenset()) == []
    # Upstream declares its whole list because model.py reads and writes them by name; the wrapper's follow.
    assert {t.name for t in cfg.input} == set(inputs)
    assert {t.name for t in cfg.output} == set(outputs)
    for name, (data_type, _) in up.LLMAPI_WRAPPER_INPUTS.items():  # one vocabulary with the engine contract
        assert up.TENSORRT_LLM_INPUTS.get(name, (data_type,))[0] == data_type, name
    for name, data_type in up.LLMAPI_WRAPPER_OUTPUTS.items():
        assert up.TENSORRT_LLM_OUTPUTS.get(name, data_type) == data_type, name
    model_yaml = yaml.safe_load(files["tensorrt_llm/1/model.yaml"])
    assert set(model_yaml) >= up.MODEL_YAML_KEYS
    assert set(model_yaml) - {"triton_config"} <= up.LLM_ARGS
    assert set(model_yaml["kv_cache_config"]) <= up.KV_CACHE_CONFIG
    assert up.TRITON_CONFIG_REQUIRED <= set(model_yaml["triton_config"]) <= up.TRITON_CONFIG_KEYS
    assert model_yaml["enable_iter_perf_stats"] is True  # the gauges' source
    assert model_yaml["guided_decoding_backend"] == "xgrammar"  # the wrapper's guides


def test_the_wrapper_uses_upstreams_model_by_its_pinned_names() -> None:
    """What runtime/llmapi_model.py relies on in NVIDIA's model.py, and the IterationStats names
    trtllm_metrics.py reads: a release that renames them fails here once the pins follow it."""
    wrapper = (REPO / "operator/llm_operator/runtime/llmapi_model.py").read_text()
    assert f"from base_model import {up.LLMAPI_MODEL_CLASS} as BaseModel" in wrapper
    for name in (*up.LLMAPI_MODEL_ATTRIBUTES, *up.LLMAPI_MODEL_METHODS, up.LLM_STATS_METHOD):
        assert name in wrapper, name
    # Its overrides take upstream's arguments, call upstream's, and hand back what upstream's return.
    tree = ast.parse(wrapper)
    defs = {f.name: f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)}
    for name, args in up.LLMAPI_MODEL_OVERRIDES.items():
        assert tuple(a.arg for a in defs[name].args.args) == args, name
        assert f"super().{name}(" in ast.unparse(defs[name]), name
    convert = ast.unparse(defs["_convert_request"])
    assert f"return ({', '.join(up.LLMAPI_CONVERT_REQUEST_RETURNS)})" in convert
    assert f"{', '.join(up.LLMAPI_CONVERT_REQUEST_RETURNS)} = super()._convert_request(request)" in convert
    # The CPU base model provides the same, so the same wrapper runs on CPU pods.
    cpu = (REPO / "operator/llm_operator/runtime/cpu_reference/llmapi.py").read_text()
    for name in (f"class {up.LLMAPI_MODEL_CLASS}", *up.LLMAPI_MODEL_ATTRIBUTES, *up.LLMAPI_MODEL_METHODS):
        assert name in cpu, name
    stats: dict[str, Any] = {
        "numActiveRequests": 5, "numQueuedRequests": 3, "maxNumActiveRequests": 8,
        "inflightBatchingStats": {"numScheduledRequests": 4, "numContextRequests": 1},
        "kvCacheStats": {"maxNumBlocks": 100, "freeNumBlocks": 75, "usedNumBlocks": 25, "tokensPerBlock": 32},
    }  # fmt: skip
    assert set(stats) - {"inflightBatchingStats", "kvCacheStats"} <= up.ITERATION_STATS
    assert set(stats["inflightBatchingStats"]) <= up.INFLIGHT_BATCHING_STATS
    assert set(stats["kvCacheStats"]) <= up.KV_CACHE_STATS
    assert from_iteration_stats(stats) == {
        REQUEST_METRICS: {"active": 5, "max": 8, "scheduled": 4, "context": 1, "waiting": 3 + 1},
        KV_CACHE_BLOCK_METRICS: {"max": 100, "free": 75, "used": 25, "tokens_per": 32, "fraction": 0.25},
    }


def test_the_cpu_reference_models_are_subsets_of_upstreams() -> None:
    """The CPU runtime serves the engine contract: its tensorrt_llm model (token ids, what the
    front door calls) and its ensemble (text, for /v2 clients) take upstream's tensors, with their
    types, optionality and shapes, so clients written against them work on GPUs."""
    cpu = LLMDeploymentSpec.model_validate(
        {
            "model": {"name": "m", "source": {"uri": "builtin://tiny-llama"}},
            "engine": {"backend": "cpu-reference", "cpuReference": {"contract": "tensorrt-engine"}},
        }
    )
    rendered = configs(render_repository(cpu, POOL, engine_dir="", tokenizer_dir=""))
    assert set(rendered) == {"tensorrt_llm", "ensemble"}
    for model, (inputs, outputs) in {
        "ensemble": (up.ENSEMBLE_INPUTS, up.ENSEMBLE_OUTPUTS),
        "tensorrt_llm": (up.TENSORRT_LLM_INPUTS, up.TENSORRT_LLM_OUTPUTS),
    }.items():
        cfg = rendered[model]
        # Its parameters configure the CPU model itself; its tensors are upstream's.
        assert held_against(cfg, inputs, outputs, frozenset(cfg.parameters)) == [], model
        assert missing(cfg, inputs, frozenset()) == [], model
    # The front door's ids and the engine's answers, at the shapes of upstream's tensorrt_llm.
    gpu = configs(
        render_repository(
            spec("tensorrt-engine", "pvc://models/m"), POOL, engine_dir="/e", tokenizer_dir="/e/t"
        )
    )["tensorrt_llm"]
    shapes = {t.name: (list(t.dims), list(t.reshape.shape)) for t in (*gpu.input, *gpu.output)}
    cpu_llm = rendered["tensorrt_llm"]
    assert {t.name: (list(t.dims), list(t.reshape.shape)) for t in (*cpu_llm.input, *cpu_llm.output)} == {
        t.name: shapes[t.name] for t in (*cpu_llm.input, *cpu_llm.output)
    }
    assert {"output_ids", "sequence_length"} <= {t.name for t in cpu_llm.output}


def test_the_cpu_ensemble_calls_tensorrt_llm_by_upstreams_names() -> None:
    """The CPU ensemble (runtime/cpu_reference/ensemble.py, a BLS model) hands each of its inputs on
    to `tensorrt_llm` under the name upstream's ensemble maps it to; the inputs it sets itself
    and the outputs it reads are tensorrt_llm's too. (Parsed, not imported: the module needs
    Triton's stub.)"""
    source = (REPO / "operator/llm_operator/runtime/cpu_reference/ensemble.py").read_text()
    tree = ast.parse(source)
    (passed,) = [
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == ["PASSED"]
    ]
    assert set(passed) <= set(up.ENSEMBLE_INPUTS)
    assert set(passed.values()) <= set(up.TENSORRT_LLM_INPUTS)
    for name in ("input_ids", "input_lengths", "exclude_input_in_output", "streaming"):
        assert f'pb_utils.Tensor("{name}"' in source and name in up.TENSORRT_LLM_INPUTS, name
    for name in ("output_ids", "sequence_length"):
        assert f'"{name}"' in source and name in up.TENSORRT_LLM_OUTPUTS, name
