"""engine.backend pytorch end to end through the pure layers: spec -> plan -> desired objects ->
the launcher's command. No build Job, the checkpoint where the LLM API reads it, the spec's
limits in model.yaml, a release that ships the llmapi model. A replica across pods:
test_pytorch_multi_node.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator.api import crd
from llm_operator.api.v1alpha1 import KEEP_ENGINES, Backend, LLMDeployment, LLMDeploymentSpec
from llm_operator.desired import desired, plan_for
from llm_operator.engine.state import BuildObserved, EngineState
from llm_operator.plan.types import PlanningError
from llm_operator.rollout import queries
from llm_operator.runtime.commands import serve_command
from llm_operator.runtime.config import PodConfig
from llm_operator.runtime.launcher import launch
from llm_operator.runtime.preflight import image_files
from llm_operator.runtime.repository import configmap_path
from llm_operator.runtime.supervisor import Stop
from pydantic import ValidationError

from tests.unit.model_cache_fixtures import CACHED, cached
from tests.unit.test_reconciler import condition, example, operator_with_nodes, reconcile
from tests.unit.test_render_rollout import IMAGES, deployment

V1 = dataclasses.replace(IMAGES, trtllm_version="1.1.0")


def never_built(namespace: str, key: str, job: str) -> BuildObserved:
    raise AssertionError("the pytorch backend looks up no engine build")


def pytorch(**spec: Any) -> LLMDeployment:
    return deployment("llama31-8b-pytorch", **spec)


def render(ld: LLMDeployment) -> dict[str, dict[str, Any]]:
    out = desired(ld, plan_for(ld, None), V1, never_built, models=cached)
    assert out.jobs == [] and {e.state for e in out.engines.values()} == {EngineState.NOT_NEEDED}
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in out.children}


def repository(objs: dict[str, dict[str, Any]]) -> dict[str, str]:
    (cm,) = (o for o in objs.values() if o["kind"] == "ConfigMap")
    return {configmap_path(k): v for k, v in cm["data"].items()}


def pod_spec(objs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (sts,) = (o for o in objs.values() if o["kind"] == "StatefulSet")
    spec: dict[str, Any] = sts["spec"]["template"]["spec"]
    return spec


def test_a_pvc_checkpoint_is_mounted_read_only_and_named_in_model_yaml() -> None:
    objs = render(pytorch())
    model = yaml.safe_load(repository(objs)["tensorrt_llm/1/model.yaml"])
    assert model["model"] == "/checkpoint/meta-llama/Llama-3.1-8B-Instruct" and "revision" not in model
    assert (model["backend"], model["dtype"]) == ("pytorch", "bfloat16")
    assert (model["tensor_parallel_size"], model["pipeline_parallel_size"]) == (2, 1)
    assert (model["max_batch_size"], model["max_seq_len"], model["max_num_tokens"]) == (64, 8192, 8192)
    assert model["triton_config"] == {"max_batch_size": 0, "decoupled": True}
    pod = pod_spec(objs)
    (container,) = pod["containers"]
    assert {"name": "checkpoint", "mountPath": "/checkpoint", "readOnly": True} in container["volumeMounts"]
    claim = {"name": "checkpoint", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}
    assert claim in pod["volumes"]
    assert not any(v["name"] == "engine-cache" for v in pod["volumes"])
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"  # tp*pp
    assert {"name": "LLMOP_BACKEND", "value": "pytorch"} in container["env"]
    assert "envFrom" not in container


def test_an_hf_checkpoint_is_read_from_the_model_cache_and_its_secret_stays_with_the_fetch() -> None:
    source = {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct", "credentialsSecretRef": {"name": "hf-token"}}
    ld = pytorch(model={"name": "meta-llama/Llama-3.1-8B-Instruct", "source": source, "revision": "0e9e39f",
                        "cache": {"claimName": "llm-model-cache"}})  # fmt: skip
    objs = render(ld)
    model = yaml.safe_load(repository(objs)["tensorrt_llm/1/model.yaml"])
    directory = f"/var/lib/llm-operator/model-cache/{CACHED.directory}"
    assert model["model"] == directory and "revision" not in model, "the cache fetched the revision"
    pod = pod_spec(objs)
    (container,) = pod["containers"]
    assert "envFrom" not in container, "nothing in the serving pod downloads"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LLMOP_MODEL_DIR"] == env["LLMOP_TOKENIZER_DIR"] == directory
    claim = {"claimName": "llm-model-cache", "readOnly": True}
    assert {"name": "model-cache", "persistentVolumeClaim": claim} in pod["volumes"]
    assert not any(v["name"] == "checkpoint" for v in pod["volumes"])
    fetching = desired(ld, plan_for(ld, None), V1, never_built)  # nothing cached yet
    (job,) = fetching.jobs
    assert job["spec"]["template"]["spec"]["containers"][0]["envFrom"] == [
        {"secretRef": {"name": "hf-token"}}
    ]
    assert fetching.children == [], "nothing serves before the model is cached"


def test_the_spec_kv_and_streaming_settings_reach_model_yaml() -> None:
    runtime = {"streaming": False, "chunkedContext": False,
               "kvCache": {"freeGpuMemoryPercent": 70, "blockReuse": False, "maxTokens": 100000}}  # fmt: skip
    model = yaml.safe_load(repository(render(pytorch(runtime=runtime)))["tensorrt_llm/1/model.yaml"])
    assert model["kv_cache_config"] == {"free_gpu_memory_fraction": 0.7, "enable_block_reuse": False,
                                        "max_tokens": 100000}  # fmt: skip
    assert model["enable_chunked_prefill"] is False
    assert model["triton_config"]["decoupled"] is False


def test_a_release_outside_the_table_is_refused_naming_backend_and_version() -> None:
    """Where the llmapi model is depends on the release (test_releases.py covers a row without
    it); a version the table does not know is refused, every row serves."""
    ld = pytorch()
    with pytest.raises(PlanningError) as err:
        desired(ld, plan_for(ld, None), dataclasses.replace(IMAGES, trtllm_version="0.19.0"), never_built)
    assert err.value.reason == "BackendNotInRelease"
    assert "engine.backend pytorch" in err.value.message and "0.19.0" in err.value.message
    for version in ("0.20.0", "0.21.0", "1.0.0", "1.2.1"):
        desired(ld, plan_for(ld, None), dataclasses.replace(IMAGES, trtllm_version=version), never_built)


def test_canary_analysis_counts_requests_of_the_model_every_request_goes_through() -> None:
    """tensorrt_llm on either contract: the llmapi model, or the engine that the front door and
    the ensemble both call (the ensemble's series would miss the front door's requests)."""
    target = queries.Target("ns", "d", "r", 60)
    assert 'model="tensorrt_llm"' in queries.requests(target)
    assert "ensemble" not in queries.requests(target)


def config(**env: str) -> PodConfig:
    return PodConfig.from_env({"LLMOP_BACKEND": "pytorch", "LLMOP_MODEL_REPO": "/repo", **env})


def test_the_launcher_starts_one_tritonserver_under_mpirun_with_auto_complete() -> None:
    c = config(LLMOP_TP="4", LLMOP_GPUS_PER_POD="4")
    cmd = serve_command(c)
    assert cmd[:2] == ["mpirun", "--allow-run-as-root"] and cmd.count("tritonserver") == 1
    assert cmd[cmd.index("-n") + 1] == "1" and ":" not in cmd
    assert "--disable-auto-complete-config" not in cmd  # model.py applies triton_config
    assert "--http-port=8000" in cmd and "--id=rank0" in cmd
    assert list(c.local_ranks) == [0]
    assert "trtllm-llmapi-launch" not in cmd, "one pod: the LLM API spawns its workers itself"


def test_the_llmapi_code_is_taken_from_the_image_into_the_repository(tmp_path: Path) -> None:
    image = tmp_path / "app" / "all_models" / "llmapi" / "tensorrt_llm" / "1"
    image.mkdir(parents=True)
    (image / "model.py").write_text("# upstream model.py\n")
    (image / "helpers.py").write_text("# upstream helpers.py\n")
    c = config(LLMOP_LLMAPI_MODELS_DIR=str(tmp_path / "app" / "all_models" / "llmapi"))
    assert image_files(c) == {
        "tensorrt_llm/1/base_model.py": Path(c.llmapi_models_dir) / "tensorrt_llm/1/model.py",
        "tensorrt_llm/1/helpers.py": Path(c.llmapi_models_dir) / "tensorrt_llm/1/helpers.py",
    }
    src = tmp_path / "cm"
    src.mkdir()
    for path, text in repository(render(pytorch())).items():
        (src / path.replace("/", "__")).write_text(text)
    c = dataclasses.replace(
        c, model_repo_src=str(src), model_repo=str(tmp_path / "repo"), tritonserver="/no/tritonserver"
    )

    stop = Stop()
    stop.signum = 15  # stop at once: only the materialized repository is of interest
    launch(c, stop, {})
    repo = tmp_path / "repo" / "tensorrt_llm"
    assert sorted(p.name for p in (repo / "1").iterdir()) == [
        "base_model.py", "helpers.py", "llmapi_structured.py", "model.py", "model.yaml", "trtllm_metrics.py"
    ]  # fmt: skip
    assert (repo / "1" / "helpers.py").read_text() == "# upstream helpers.py\n"
    # Upstream's model is the base of the operator's wrapper, which the ConfigMap carries.
    assert (repo / "1" / "base_model.py").read_text() == "# upstream model.py\n"
    assert "from base_model import TritonPythonModel" in (repo / "1" / "model.py").read_text()


async def test_the_reconciler_serves_it_without_a_build_or_stalls_on_an_unknown_release(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LLMOP_TRTLLM_VERSION", "0.19.0")  # a version outside the release table
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(example("llama31-8b-pytorch"))
    await reconcile(kube, reconciler, key)
    stalled = condition(kube, "llama31-8b", "Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == "BackendNotInRelease"
    assert not {k[0] for k in kube.objects} & {"Job", "StatefulSet"}

    monkeypatch.delenv("LLMOP_TRTLLM_VERSION")  # the default release has it
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(example("llama31-8b-pytorch"))
    await reconcile(kube, reconciler, key)
    assert not kube.of_kind("Job") and ("apply", "StatefulSet", "llama31-8b") in kube.take_writes()
    engine_ready = condition(kube, "llama31-8b", "EngineReady")
    assert (engine_ready["status"], engine_ready["reason"]) == ("True", "EngineNotNeeded")
    assert "engine" not in kube.objects[("LLMDeployment", *key)]["status"]


@pytest.mark.parametrize(
    "engine",
    [
        {"build": {}},
        {"prebuilt": {"uri": "pvc://engines/llama"}},
        {"precision": "fp8"},
        {"kvCacheDtype": "fp8"},
        {"maxBeamWidth": 4},
    ],
)
def test_engine_fields_without_a_backend_are_refused_naming_tensorrt_engine(engine: dict[str, Any]) -> None:
    """pytorch is the default backend: a manifest written for engines that leaves engine.backend
    out is refused by the CEL rule at admission and by its twin in `llm-operator render`, each
    naming the way back; with the backend named it is an engine deployment."""
    doc = {"model": {"name": "m", "source": {"uri": "pvc://models/m"}}, "engine": engine}
    with pytest.raises(ValidationError, match=r"or set engine\.backend: tensorrt-engine"):
        LLMDeploymentSpec.model_validate(doc)
    named = LLMDeploymentSpec.model_validate({**doc, "engine": {**engine, "backend": "tensorrt-engine"}})
    assert named.engine.backend == Backend.TENSORRT_ENGINE
    assert LLMDeploymentSpec.model_validate({"model": doc["model"]}).engine.backend == Backend.PYTORCH
    rules = crd.openapi_schema()["properties"]["spec"]["properties"]["engine"]["x-kubernetes-validations"]
    twins = [r["message"] for r in rules if r["rule"].startswith("self.backend != 'pytorch'")]
    assert len(twins) == 4 and all(m.endswith(KEEP_ENGINES) for m in twins)
