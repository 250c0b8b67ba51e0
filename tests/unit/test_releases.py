"""The release table (operator/llm_operator/releases.py) and the backends a release can serve."""

from __future__ import annotations

import dataclasses

import pytest
from llm_operator import releases
from llm_operator.api.v1alpha1 import Backend
from llm_operator.desired import check_backend, check_release
from llm_operator.plan.types import PlanningError
from llm_operator.releases import NgcTag, Release

from tests.unit.test_render_rollout import IMAGES, deployment

# A release after the TensorRT backend's removal upstream: none is in the table yet.
PYTORCH_ONLY = Release("9.0.0", (NgcTag("27.01", "2.77.0"),), "27.01", "3.12", "600", ("580.65.06",),
                       has_tensorrt_engine_backend=False)  # fmt: skip


def test_each_ngc_tag_is_in_one_row_and_each_row_runs_its_newest_tag_but_the_default() -> None:
    tags = [t.tag for r in releases.RELEASES for t in r.tags]
    assert tags == sorted(set(tags)), "one row per tag, rows and their tags oldest first"
    assert len(releases.BY_TRTLLM) == len(releases.RELEASES), "one row per TensorRT-LLM version"
    for r in releases.RELEASES:
        if r is not releases.DEFAULT:
            assert r.ngc_tag == r.tags[-1].tag, r.trtllm
    # The default stays on the image it had: moving it rolls every serving pod.
    assert releases.DEFAULT.image == "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"
    assert (releases.DEFAULT.trtllm, releases.DEFAULT.triton) == ("1.1.0", "2.64.0")


def test_a_row_must_run_one_of_its_own_tags() -> None:
    with pytest.raises(ValueError, match=r"TensorRT-LLM 9\.0\.0: NGC tag 26\.12 is not one of its tags"):
        dataclasses.replace(PYTORCH_ONLY, ngc_tag="26.12")


def test_tensorrt_engine_is_refused_on_a_release_without_it_naming_the_last_with_it() -> None:
    with pytest.raises(PlanningError) as err:
        check_backend(Backend.TENSORRT_ENGINE, "9.0.0", PYTORCH_ONLY)
    last = releases.last_with_tensorrt_engine()
    assert last.trtllm == "1.2.1", "every row of the table still has the engine backend"
    assert err.value.reason == "BackendNotInRelease"
    assert "engine.backend tensorrt-engine" in err.value.message and "TensorRT-LLM 9.0.0" in err.value.message
    assert f"TensorRT-LLM {last.trtllm}" in err.value.message and last.image in err.value.message
    check_backend(Backend.PYTORCH, "9.0.0", PYTORCH_ONLY)
    check_backend(Backend.TENSORRT_ENGINE, "9.0.0", None)  # the spec's own images: not judged
    for r in releases.RELEASES:
        check_backend(Backend.TENSORRT_ENGINE, r.trtllm, r)
        check_backend(Backend.PYTORCH, r.trtllm, r)


def test_pytorch_is_refused_on_a_release_without_the_llmapi_model_or_outside_the_table() -> None:
    no_llmapi = dataclasses.replace(PYTORCH_ONLY, has_pytorch_backend=False)
    for release, why in ((no_llmapi, "which has none"), (None, "which is not in its release table")):
        with pytest.raises(PlanningError) as err:
            check_backend(Backend.PYTORCH, "9.0.0", release)
        assert err.value.reason == "BackendNotInRelease" and why in err.value.message
        assert "TensorRT-LLM 9.0.0" in err.value.message and "1.1.0" in err.value.message


def test_the_engines_version_decides_for_tensorrt_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(releases.BY_TRTLLM, "9.0.0", PYTORCH_ONLY)
    ld = deployment("llama3-70b-fp8")
    with pytest.raises(PlanningError, match=r"not in TensorRT-LLM 9\.0\.0"):
        check_release(ld, dataclasses.replace(IMAGES, trtllm_version="9.0.0"))
    check_release(ld, IMAGES)
    engine = ld.spec.engine.model_dump(by_alias=True, exclude_none=True)
    engine["build"]["tensorrtLlmVersion"] = "9.0.0"
    with pytest.raises(PlanningError, match=r"not in TensorRT-LLM 9\.0\.0"):
        check_release(deployment("llama3-70b-fp8", engine=engine), IMAGES)
