"""The pytorch backend's start-up caches (render/startup_cache.py): one directory of the model
cache's claim per model, revision, release, GPU product, layout and precision, mounted read-write at
that directory alone, with each library's variable pointing into it; nothing for backends and
sources that have no such cache. And the launcher drops a torn autotuner file before it starts."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from llm_operator.api.v1alpha1 import LLMDeployment
from llm_operator.contract import AUTOTUNER_CACHE_ENV, MODEL_CACHE_MOUNT, STARTUP_CACHE_MOUNT
from llm_operator.desired import desired, plan_for
from llm_operator.runtime.startup_cache import drop_unreadable

from tests.unit.model_cache_fixtures import CACHED, cached
from tests.unit.test_pytorch_backend import V1, never_built, pytorch
from tests.unit.test_render_rollout import deployment

CACHE = {"claimName": "llm-model-cache"}
HF = {"name": "meta-llama/Llama-3.1-8B-Instruct", "source": {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct"},
      "cache": CACHE}  # fmt: skip
VARIABLES = {AUTOTUNER_CACHE_ENV, "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE"}


def pod_specs(ld: LLMDeployment, images: Any = V1) -> list[dict[str, Any]]:
    out = desired(ld, plan_for(ld, None), images, never_built, models=cached)
    return [o["spec"]["template"]["spec"] for o in out.children if o["kind"] == "StatefulSet"]


def startup_mount(pod: dict[str, Any]) -> dict[str, Any] | None:
    (container,) = pod["containers"]
    found = [m for m in container["volumeMounts"] if m["name"] == "startup-cache"]
    return found[0] if found else None


def test_a_cached_models_pods_keep_their_start_up_caches_beside_it_on_the_claim() -> None:
    (pod,) = pod_specs(pytorch(model=HF))
    mount = startup_mount(pod)
    assert mount is not None and mount["mountPath"] == STARTUP_CACHE_MOUNT and "readOnly" not in mount
    source_key, revision = CACHED.directory.removeprefix("models/").split("/")
    key = f"trtllm-1.1.0-NVIDIA-H100-80GB-HBM3-tp2-pp1-bf16-{mount['subPath'][-8:]}"
    assert mount["subPath"] == f"startup/{source_key}/{revision}/{key}"
    assert {"name": "startup-cache", "persistentVolumeClaim": CACHE} in pod["volumes"]
    # The weights stay read-only: the claim's model mount is unchanged.
    (container,) = pod["containers"]
    assert {"name": "model-cache", "mountPath": MODEL_CACHE_MOUNT, "readOnly": True} in container[
        "volumeMounts"
    ]
    env = {e["name"]: e.get("value", "") for e in container["env"]}
    assert {n: env[n] for n in VARIABLES} == {
        AUTOTUNER_CACHE_ENV: f"{STARTUP_CACHE_MOUNT}/autotuner/autotuner.json",
        "TORCHINDUCTOR_CACHE_DIR": f"{STARTUP_CACHE_MOUNT}/torchinductor",
        "TRITON_CACHE_DIR": f"{STARTUP_CACHE_MOUNT}/triton",
        "FLASHINFER_WORKSPACE_BASE": f"{STARTUP_CACHE_MOUNT}/flashinfer",
    }
    # Written as the fetch Job's group, which owns the claim's files.
    assert (pod["securityContext"]["fsGroup"], pod["securityContext"]["fsGroupChangePolicy"]) == (
        1000,
        "OnRootMismatch",
    )


def subpath(ld: LLMDeployment, images: Any = V1) -> str:
    (pod,) = pod_specs(ld, images)
    mount = startup_mount(pod)
    assert mount is not None
    return str(mount["subPath"])


def test_the_key_changes_with_what_a_cached_tactic_depends_on_and_not_with_replicas() -> None:
    base = subpath(pytorch(model=HF))
    assert subpath(pytorch(model=HF, replicas=3)) == base
    assert subpath(pytorch(model=HF, parallelism={"tensor": 1, "pipeline": 1})) != base
    assert subpath(pytorch(model=HF, engine={"backend": "pytorch", "precision": "fp16"})) != base
    assert subpath(pytorch(model=HF, runtime={"image": "registry.example.com/trtllm:mine"})) != base
    assert subpath(pytorch(model=HF), dataclasses.replace(V1, runtime="nvcr.io/other:1")) != base
    a100 = pytorch(model=HF, resources={"gpu": {"products": ["NVIDIA-A100-SXM4-80GB"]}})
    assert "-NVIDIA-A100-SXM4-80GB-" in subpath(a100)


def test_a_users_own_cache_variable_wins() -> None:
    (pod,) = pod_specs(pytorch(model=HF, runtime={"env": [{"name": "TRITON_CACHE_DIR", "value": "/mine"}]}))
    (container,) = pod["containers"]
    assert [e["value"] for e in container["env"] if e["name"] == "TRITON_CACHE_DIR"] == ["/mine"]


def test_nothing_is_kept_without_a_model_cache_or_on_another_backend() -> None:
    assert all(startup_mount(p) is None for p in pod_specs(pytorch()))  # pvc://: the user's claim
    engines = deployment("llama3-8b-h100", model=HF)  # tensorrt-engine: built engines, no autotuner
    assert all(startup_mount(p) is None and "fsGroup" not in p["securityContext"] for p in pod_specs(engines))


def test_the_launcher_drops_a_torn_autotuner_file_and_keeps_the_rest(tmp_path: Path) -> None:
    """Two pods of one key finishing their warm-up together write the same files; a file cut short
    would fail every later load (upstream's load_cache raises), so the launcher removes it first."""
    whole = tmp_path / "autotuner.rank0.json"
    whole.write_text(json.dumps({"metadata": {}, "cache_data": {}}))
    torn = tmp_path / "autotuner.rank1.json"
    torn.write_text('{"metadata": {"lib_version": "1.1.0"}, "cache_da')
    other = tmp_path / "notes.txt"
    other.write_text("not the autotuner's")
    said = drop_unreadable({AUTOTUNER_CACHE_ENV: str(tmp_path / "autotuner.json")})
    assert (whole.exists(), torn.exists(), other.exists()) == (True, False, True)
    assert said == [f"dropped the unreadable autotuner cache {torn} (a write cut short): it is tuned again"]
    assert (
        drop_unreadable({}) == []
        and drop_unreadable({AUTOTUNER_CACHE_ENV: str(tmp_path / "none/x.json")}) == []
    )
