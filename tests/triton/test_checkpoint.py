"""The cpu-reference model on a real Triton server, serving a cached checkpoint directory
(LLMOP_MODEL_DIR, as the operator mounts the model cache) instead of its builtin weights: the text
is the checkpoint seed's, and a directory that is not a checkpoint fails the load with one line
naming the file."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.plan.cpu import cpu_plan
from llm_operator.runtime.cpu_reference import TINY_MODELS, checkpoint
from llm_operator.runtime.cpu_reference.tiny_lm import TinyLM

from tests.triton.conftest import cpu_spec, serve
from tests.triton.server import TritonProcess

pytestmark = pytest.mark.triton

PROMPT, MAX_TOKENS = "weights from the cache", 24
SAME_PLAN = cpu_plan(cpu_spec(streaming=False)).primary


def cached_spec() -> LLMDeploymentSpec:
    """A cpu-reference deployment of a cached s3:// source: its repository names no builtin model.
    Copied rather than validated (and planned as the builtin one, SAME_PLAN), so the test does not
    depend on admission's and planning's rules for sources."""
    spec = cpu_spec(streaming=False)
    source = spec.model.source.model_copy(update={"uri": "s3://models/tiny-llama"})
    model = spec.model.model_copy(update={"source": source})
    return spec.model_copy(update={"model": model})


def generate(server: TritonProcess, prompt: str) -> str:
    body = json.dumps({"text_input": prompt, "max_tokens": MAX_TOKENS}).encode()
    url = f"http://127.0.0.1:{server.http_port}/v2/models/ensemble/generate"
    with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=60) as r:
        return str(json.loads(r.read())["text_output"])


def test_the_model_serves_the_checkpoint_in_llmop_model_dir(tmp_path: Path) -> None:
    model_dir = tmp_path / "models/s3-0123456789abcdef/etags-0123456789abcdef"
    checkpoint.write(model_dir, seed=1)
    (tmp_path / "server").mkdir()
    server = serve(tmp_path / "server", cached_spec(), {"LLMOP_MODEL_DIR": str(model_dir)}, SAME_PLAN)
    running = next(server)
    try:
        seed1 = "".join(TinyLM(TINY_MODELS["tiny-llama"], 1).generate(PROMPT, MAX_TOKENS))
        seed0 = "".join(TinyLM(TINY_MODELS["tiny-llama"], 0).generate(PROMPT, MAX_TOKENS))
        assert seed1 != seed0
        assert generate(running, PROMPT) == seed1
    finally:
        server.close()


def test_a_directory_that_is_not_a_checkpoint_fails_the_load_naming_the_file(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    checkpoint.write(model_dir, seed=0)
    (model_dir / "config.json").write_text(json.dumps({"model_type": checkpoint.MODEL_TYPE}))
    (tmp_path / "server").mkdir()
    with pytest.raises(pytest.fail.Exception) as failed:
        next(serve(tmp_path / "server", cached_spec(), {"LLMOP_MODEL_DIR": str(model_dir)}, SAME_PLAN))
    assert f"{model_dir}/config.json has no 'num_hidden_layers'" in str(failed.value)
