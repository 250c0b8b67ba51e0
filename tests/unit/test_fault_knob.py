"""The CPU runtime's TEST-ONLY fault knob (faults.py) and the time-to-first-token bucket edges the
model repository renders at the canary analysis's budget (both backends, Triton's own schema)."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import text_format
from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.modelrepo import render_repository
from llm_operator.plan.cpu import cpu_plan
from llm_operator.runtime.cpu_reference.faults import Faults
from pydantic import ValidationError
from tritonclient.grpc import model_config_pb2

from tests.unit.test_model_repo import POOL

FAMILY = "nv_inference_first_response_histogram_ms"


def test_error_share_is_exact_and_spread_evenly() -> None:
    assert [n for n in range(20) if Faults(error_percent=25).fails(n)] == [3, 7, 11, 15, 19]
    for percent in (0, 1, 10, 33, 50, 99.5, 100):
        failed = [n for n in range(1000) if Faults(error_percent=percent).fails(n)]
        assert len(failed) == int(percent * 10)
        # Every 100 consecutive requests hold floor or ceil of the share.
        window = [sum(Faults(error_percent=percent).fails(n) for n in range(s, s + 100)) for s in range(900)]
        assert max(window) - min(window) <= 1


def test_settings_come_from_the_environment_and_bad_values_name_the_variable() -> None:
    assert Faults.from_env({}, "m-0") == Faults() and not Faults().active
    faults = Faults.from_env({"LLMOP_FAULT_ERROR_PERCENT": "12.5", "LLMOP_FAULT_TTFT_MS": "1500",
                              "LLMOP_FAULT_LATENCY_MS": " 20 "}, "m-0")  # fmt: skip
    assert faults == Faults(error_percent=12.5, latency_ms=20, ttft_ms=1500) and faults.active
    assert (
        faults.describe()
        == "LLMOP_FAULT_ERROR_PERCENT=12.5, LLMOP_FAULT_LATENCY_MS=20, LLMOP_FAULT_TTFT_MS=1500"
    )
    for name, value in (("LLMOP_FAULT_ERROR_PERCENT", "101"), ("LLMOP_FAULT_TTFT_MS", "-1"),
                        ("LLMOP_FAULT_LATENCY_MS", "soon"), ("LLMOP_FAULT_TTFT_MS", "nan")):  # fmt: skip
        with pytest.raises(ValueError, match=f"^{name}='{value}': expected a number from 0 to "):
            Faults.from_env({name: value}, "m-0")


def test_a_pod_list_limits_the_knob_to_those_pods() -> None:
    """One straggler among healthy replicas of one revision (the routing tests' slow replica)."""
    env = {"LLMOP_FAULT_TTFT_MS": "400", "LLMOP_FAULT_PODS": "m-2, m-5"}
    assert Faults.from_env(env, "m-2") == Faults.from_env(env, "m-5") == Faults(ttft_ms=400)
    for other in ("m-0", "m-1", "m-20", "m", ""):
        assert Faults.from_env(env, other) == Faults(), other
    assert Faults.from_env({**env, "LLMOP_FAULT_PODS": " "}, "m-0") == Faults(ttft_ms=400), "blank: all"
    with pytest.raises(ValueError, match=r"^LLMOP_FAULT_TTFT_MS='soon'"):  # a typo fails every pod
        Faults.from_env({**env, "LLMOP_FAULT_TTFT_MS": "soon"}, "m-0")


def test_the_step_knob_costs_each_step_per_sequence_so_capacity_falls_with_it() -> None:
    """A slower engine (the routing straggler): a step of n unfinished sequences is n x STEP_MS
    longer, so an instance's tokens per second are capped at 1000 / STEP_MS whatever its batch."""
    env = {"LLMOP_FAULT_STEP_MS": "150", "LLMOP_FAULT_PODS": "m-2"}
    faults = Faults.from_env(env, "m-2")
    assert faults == Faults(step_ms=150) and faults.active
    assert faults.describe() == "LLMOP_FAULT_STEP_MS=150"
    assert [faults.step_delay_ms(n) for n in (0, 1, 8)] == [0, 150, 1200]
    # 16-token completions in batches of 1 or 8 take the same time per token: no more capacity.
    assert 16 * faults.step_delay_ms(8) / 8 == 16 * faults.step_delay_ms(1) == 2400
    assert Faults.from_env(env, "m-0").step_delay_ms(8) == 0, "a healthy pod's steps are not slowed"
    with pytest.raises(ValueError, match=r"^LLMOP_FAULT_STEP_MS='-5': expected a number from 0 to "):
        Faults.from_env({"LLMOP_FAULT_STEP_MS": "-5"}, "m-0")


def spec(backend: str, budget: int | None, env: list[dict[str, str]] | None = None) -> LLMDeploymentSpec:
    cpu = backend == "cpu-reference"
    analysis: dict[str, Any] = {"prometheus": {"url": "http://prometheus:9090"}, "maxErrorRatePercent": 1}
    if budget:
        analysis["maxTimeToFirstTokenMilliseconds"] = budget
    return LLMDeploymentSpec.model_validate({
        "model": {"name": "m", "source": {"uri": "builtin://tiny-llama" if cpu else "pvc://models/m"}},
        "engine": {"backend": backend, "maxBatchSize": 8},
        "runtime": {"env": env or []},
        "rollout": {"canary": {"steps": [{"weight": 10}], "analysis": analysis}},
    })  # fmt: skip


def counted(backend: str, budget: int | None) -> Any:
    s = spec(backend, budget)
    pool = cpu_plan(s).primary if backend == "cpu-reference" else POOL
    files = render_repository(s, pool, engine_dir="/e", tokenizer_dir="/e/tokenizer")
    # The model every request goes through, whose requests canary analysis counts (rollout/
    # queries.py): the CPU runtime's llmapi model (its default contract), the GPU engine.
    return text_format.Parse(files["tensorrt_llm/config.pbtxt"], model_config_pb2.ModelConfig())


@pytest.mark.parametrize(("budget", "edges"), [(None, [100, 500, 2000, 5000]),
                                               (1000, [100, 500, 1000, 2000, 5000]),
                                               (750, [100, 500, 750, 1500, 2000, 5000]),
                                               (8000, [100, 500, 2000, 5000, 8000, 16000])])  # fmt: skip
def test_ttft_buckets_have_an_edge_at_the_budget_and_one_above(budget: int | None, edges: list[int]) -> None:
    cpu = counted("cpu-reference", budget)
    assert cpu.parameters["ttft_buckets_ms"].string_value == ", ".join(map(str, edges))
    gpu = counted("tensorrt-engine", budget)
    if budget is None:  # Triton's defaults: nothing rendered (older images know no model_metrics)
        assert not gpu.HasField("model_metrics")
        return
    (control,) = gpu.model_metrics.metric_control
    assert control.metric_identifier.family == FAMILY
    assert list(control.histogram_options.buckets) == edges


def test_the_fault_knob_is_the_only_reserved_name_a_user_may_set() -> None:
    assert spec("cpu-reference", None, [{"name": "LLMOP_FAULT_TTFT_MS", "value": "900"}]).runtime.env
    with pytest.raises(ValidationError, match="operator's pod contract"):
        spec("cpu-reference", None, [{"name": "LLMOP_TP", "value": "2"}])
