"""examples/cpu-reference-llmapi.yaml on the real node: the CPU runtime speaking the LLM API contract
(engine.cpuReference.contract: pytorch, Triton's `tensorrt_llm` model as the pytorch backend serves
it on GPUs) becomes Ready, and the official openai SDK gets, streamed and not, the text the same
tiny model decodes in this process (the text the ensemble contract serves: tests/triton/
test_frontdoor.py holds it to the same reference), with the model's own finish_reason. The pod's
metrics port has the TensorRT-LLM backend's load gauges under the model `tensorrt_llm`, which the
operator's llmapi wrapper sets from the engine's iteration stats, as on GPU pods. The SDK's
`chat.completions.parse` with a pydantic model gets a valid object: response_format as the
wrapper's guide inputs, which the CPU llmapi model compiles with xgrammar; tool_choice named and
required (the same guide inputs) get tool calls whose arguments validate, streamed and not. Through
the same client Service (spec.routing.mode service), the clients users run (tests/e2e/clients.py:
aiperf, inference-perf, guidellm, LiteLLM) each complete a bounded run with no failed request;
tests/e2e/test_routing.py runs them through the router."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.contract import METRICS_PORT
from llm_operator.modelrepo import weights_seed
from llm_operator.runtime.cpu_reference import TINY_MODELS
from llm_operator.runtime.cpu_reference.tiny_lm import TinyLM
from prometheus_client.parser import text_string_to_metric_families

from e2e.chat import base_url
from e2e.cluster.testing import E2ECluster, Kubectl, condition, is_true, wait_for
from tests.e2e import clients, openai_sdk

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cpu-reference-llmapi.yaml"
NAME = "tiny-llama-llmapi"
PROMPT, MAX_TOKENS = "Once upon a time", 24
GAUGES = ("nv_trt_llm_request_metrics", "nv_trt_llm_kv_cache_block_metrics")


def test_the_llm_api_contract_serves_the_reference_text_and_the_trtllm_gauges(
    operator: None, embedded: E2ECluster, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["resources"]["cpu"] = "250m"  # the node has 2 CPUs for the whole suite
    spec = LLMDeploymentSpec.model_validate(doc["spec"])
    lm = TinyLM(TINY_MODELS["tiny-llama"], weights_seed(spec.model.revision or "main"))
    want = "".join(lm.generate(PROMPT, MAX_TOKENS))
    kubectl.apply(doc, namespace=namespace)
    ld = wait_for(f"{NAME} Ready", lambda: kubectl.get("llmdeployment", NAME, namespace),
                  lambda d: is_true(d, "Ready"), timeout=300)  # fmt: skip
    url = ((ld or {}).get("status") or {}).get("endpoints", {}).get("openai")
    assert url == f"http://{NAME}.{namespace}.svc:8080/v1", condition(ld, "Ready")
    assert embedded.launcher is not None
    with base_url(embedded.launcher, url) as served_url:
        client = openai_sdk.client(served_url)
        whole = client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=MAX_TOKENS,
                                          temperature=0)  # fmt: skip
        assert (whole.choices[0].text, whole.choices[0].finish_reason) == (want, "length")
        chunks = list(client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=MAX_TOKENS,
                                                temperature=0, stream=True))  # fmt: skip
        assert "".join(c.choices[0].text for c in chunks if c.choices) == want
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        openai_sdk.parses_and_calls_tools(client, "tiny-llama")
        openai_sdk.speaks_openai(served_url, "llm-operator/tiny-llama", "tiny-llama")
        # The clients users run, through the client Service (spec.routing.mode service).
        clients.completes_every_run(served_url, "tiny-llama", tmp_path)

    (pod,) = kubectl.items("pods", namespace, f"llmoperator.io/deployment={NAME}")
    path = f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}:{METRICS_PORT}/proxy/metrics"

    def gauges() -> dict[tuple[str, str | None], float]:
        families = text_string_to_metric_families(kubectl("get", "--raw", path).stdout)
        return {(s.name, s.labels.get("request_type") or s.labels.get("kv_cache_block_type")): s.value
                for f in families for s in f.samples
                if s.name in GAUGES and s.labels.get("model") == "tensorrt_llm"}  # fmt: skip

    # The wrapper polls the iteration stats about once a second (runtime/llmapi_model.py): its
    # gauges may trail the requests by that much.
    batch = spec.engine.max_batch_size
    seen = wait_for("the load gauges of the model tensorrt_llm", gauges,
                    lambda g: g.get((GAUGES[0], "max")) == batch, timeout=30)  # fmt: skip
    assert seen[(GAUGES[1], "tokens_per")] == 32 and seen[(GAUGES[1], "max")] > 0, seen
