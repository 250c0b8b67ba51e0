"""Manifests an earlier operator accepted and served, under today's rules (docs/upgrading.md,
"Manifests refused by newer rules"): one minimal old manifest per tightening, with the commit that
tightened it. Each is either refused with a message that names the field and what to write
instead, or still served as before.

A refused manifest is checked on both paths a user meets it: `kubectl apply` (the CRD's CEL rule
or schema bound, whose message is asserted here; tests/e2e/test_admission.py evaluates the rules
on a real API server) and an object stored before the upgrade, which the API server does not check
again: the operator's parse (the CEL rule's pydantic twin, shown as Stalled InvalidSpec) or its
planning (Stalled with the PlanningError's reason)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import pytest
from llm_operator import releases
from llm_operator.api import crd
from llm_operator.api.v1alpha1 import LLMDeployment
from llm_operator.controller.deployment_body import first_error
from llm_operator.controller.rollout.prometheus_urls import analysis_endpoint, parse_list
from llm_operator.desired import desired, plan_for
from llm_operator.engine.state import BuildFact, BuildObserved
from llm_operator.images import Images
from llm_operator.plan.types import PlanningError
from llm_operator.render.autoscaling import DEFAULT_PROMETHEUS_URL
from pydantic import ValidationError

from tests.unit.model_cache_fixtures import cached

# The operator's analysis endpoints by default (chart value operator.analysisPrometheusUrls).
ALLOWED_ANALYSIS = parse_list(DEFAULT_PROMETHEUS_URL, "default")
IMAGES = Images(releases.DEFAULT.image, "cpu-runtime:1", "builder:1", releases.DEFAULT.trtllm, "launcher:1")
H100 = "NVIDIA-H100-80GB-HBM3"
# Stored objects: the API server wrote engine.backend's default of the day into each, and until
# b4df78f that was tensorrt-engine.
BASE: dict[str, Any] = {
    "model": {"name": "meta-llama/Meta-Llama-3-8B-Instruct", "source": {"uri": "pvc://models/llama3-8b"}},
    "engine": {"backend": "tensorrt-engine"},
    "parallelism": {"tensor": 1, "pipeline": 1},
    "resources": {"gpu": {"products": [H100]}},
}
CPU: dict[str, Any] = {
    "model": {"name": "tiny-llama", "source": {"uri": "builtin://tiny-llama"}},
    "engine": {"backend": "cpu-reference"},
}
SERVED = "served"


@dataclass(frozen=True)
class Old:
    """An old manifest: `spec` merged over `base`; `rule` the (schema path, message or schema
    keyword) kubectl apply now answers with, None where admission takes it; `now` what a stored
    copy of it gets from the operator: SERVED, or a fragment of its Stalled message."""

    since: str
    spec: dict[str, Any]
    rule: tuple[str, str] | None
    now: str
    base: dict[str, Any] | None = None


HF = "hf://meta-llama/Meta-Llama-3-8B-Instruct"
CACHE = {"claimName": "llm-model-cache"}


def canary(**fields: Any) -> dict[str, Any]:
    return {"rollout": {"strategy": "canary", "canary": {"steps": [{"weight": 50}], **fields}}}


def analysis(url: str, **bounds: int) -> dict[str, Any]:
    return canary(analysis={"prometheus": {"url": url}, **bounds})


CASES: dict[str, Old] = {
    "s3 engine cache": Old(
        "d4c4565",
        {"engine": {"cache": {"uri": "s3://engines/llama"}}},
        ("spec.engine.cache.uri", "must be pvc://CLAIM/PATH"),
        "EngineStorageNotOnClaim: engine.cache.uri must be pvc://CLAIM/PATH",
    ),
    "gs prebuilt engine": Old(
        "d4c4565",
        {"engine": {"prebuilt": {"uri": "gs://engines/llama"}}},
        ("spec.engine.prebuilt.uri", "object-store engine caches are not supported yet"),
        "EngineStorageNotOnClaim: engine.prebuilt.uri must be pvc://CLAIM/PATH",
    ),
    "cpu-reference with a builtin model it does not ship": Old(
        "ce10f84",
        {"model": {"name": "m", "source": {"uri": "builtin://gpt2"}}},
        ("spec", "the cpu-reference backend serves its builtin models"),
        "UnknownBuiltinModel: the cpu-reference backend serves its builtin models",
        base=CPU,
    ),
    "pool named canary": Old(
        "52d8398",
        {"resources": {"gpu": {"products": None, "pools": [{"name": "canary", "products": [H100]}]}}},
        ("spec.resources.gpu.pools[]", "pool names b, b-*, stable and canary are reserved"),
        "pool names b, b-*, stable and canary are reserved (the second rollout slot's objects and the "
        "revision Services are named <name>-b... and <name>-stable/-canary); choose another name",
    ),
    "tokenizer on s3": Old(
        "2a7b1af",
        {"runtime": {"tokenizerUri": "s3://models/llama3-8b/tokenizer"}},
        ("spec.runtime.tokenizerUri", "runtime.tokenizerUri must be pvc://CLAIM/PATH"),
        "runtime.tokenizerUri: Value error, runtime.tokenizerUri must be pvc://CLAIM/PATH",
    ),
    "canary on gateway-api without a gateway": Old(
        "a15fd94",
        canary(trafficRouting="gateway-api"),
        ("spec.rollout.canary", "rollout.canary.gateway.parentRefs is required with trafficRouting"),
        # No twin (the models build gateway-less routes, render/rollout.py): the first CRD had no
        # gateway field and ran no canary, so a stored one renders its HTTPRoute without parents.
        SERVED,
    ),
    "canary analysis without a bound": Old(
        "a15fd94",
        analysis("http://prometheus.monitoring.svc:9090"),
        ("spec.rollout.canary.analysis", "rollout.canary.analysis needs at least one bound to check"),
        "rollout.canary.analysis needs at least one bound to check: set maxErrorRatePercent",
    ),
    "canary analysis bound above an hour": Old(
        "a15fd94",
        analysis(DEFAULT_PROMETHEUS_URL, maxP99LatencyMilliseconds=3_600_001),
        ("spec.rollout.canary.analysis.maxP99LatencyMilliseconds", "maximum"),
        "maxP99LatencyMilliseconds: Input should be less than or equal to 3600000",
    ),
    "canary analysis of a Prometheus the operator does not allow": Old(
        "5000d33",
        analysis("http://prometheus.team-a:9090", maxErrorRatePercent=5),
        None,
        "AnalysisEndpointNotAllowed: spec.rollout.canary.analysis.prometheus.url is not among the "
        "operator's allowed analysis endpoints (http://prometheus.monitoring.svc:9090): use one of them, "
        "or have the operator's administrator add it to the chart value operator.analysisPrometheusUrls",
    ),
    "model.revision on an s3 source": Old(
        "da535c7",
        {"model": {"source": {"uri": "s3://models/llama3-8b/"}, "cache": CACHE, "revision": "v2"}},
        ("spec.model", "model.revision is for hf:// sources"),
        "s3:// sources are keyed by their objects' ETags (use a new prefix for new weights)",
    ),
    "s3 source without model.cache": Old(
        "da535c7",
        {"model": {"source": {"uri": "s3://models/llama3-8b/"}}},
        ("spec.model", "model.cache.claimName is required for s3:// and hf:// sources"),
        "model.cache.claimName is required for s3:// and hf:// sources: name a PersistentVolumeClaim",
    ),
    "hf source without model.cache": Old(
        "da535c7",
        {"model": {"source": {"uri": HF}}},
        ("spec.model", "model.cache.claimName is required for s3:// and hf:// sources"),
        "model.cache.claimName is required for s3:// and hf:// sources",
    ),
    "gs source": Old(
        "da535c7",
        {"model": {"source": {"uri": "gs://models/llama3-8b/"}}},
        ("spec.model.source.uri", "use s3:// with endpoint https://storage.googleapis.com"),
        "use s3:// with endpoint https://storage.googleapis.com and HMAC keys",
    ),
    "model.revision outside the revision pattern": Old(
        "da535c7",
        {"model": {"source": {"uri": HF}, "cache": CACHE, "revision": "~v2"}},
        ("spec.model.revision", "pattern"),
        "model.revision: String should match pattern",
    ),
    "credentials in the source uri": Old(
        "d76773a",
        {"model": {"source": {"uri": "s3://KEY:SECRET@models/llama3-8b/"}, "cache": CACHE}},
        ("spec.model.source.uri", "model.source.uri must not carry credentials"),
        "put them in the Secret model.source.credentialsSecretRef names",
    ),
    "a query in the source uri": Old(
        "d76773a",
        {"model": {"source": {"uri": f"{HF}?revision=v2"}, "cache": CACHE}},
        ("spec.model.source.uri", "model.source.uri takes no query or fragment"),
        "a revision in model.revision",
    ),
    "pytorch with runtime.batching": Old(
        "f3f645c",
        {"engine": {"backend": "pytorch"}, "runtime": {"batching": {"maxQueueSize": 64}}},
        ("spec", "the pytorch backend batches and queues inside TensorRT-LLM's LLM API"),
        SERVED,  # never read by the pytorch backend: a stored object keeps its meaning
    ),
    "cpu-reference with runtime.kvCache": Old(
        "f3f645c",
        {"runtime": {"kvCache": {"blockReuse": True}, "chunkedContext": True}},
        ("spec", "the cpu-reference backend decodes each batch whole and has no KV-cache pool"),
        SERVED,  # never read by the CPU runtime
        base=CPU,
    ),
    "fp8 build without a calibration dataset": Old(
        "b1b95a9",
        {"engine": {"precision": "fp8"}},
        None,
        "CalibrationDatasetMissing: a quantized engine build calibrates on the dataset the spec names "
        "(builds no longer download cnn_dailymail from the Hub unasked): set "
        "engine.build.calibration.datasetUri to pvc://CLAIM/PATH",
    ),
    "engine build of a model whose family is not told by its name": Old(
        "b1b95a9",
        {"model": {"name": "acme/secret-model", "source": {"uri": "pvc://models/secret"}}},
        None,
        "UnknownModelFamily: the engine build picks TensorRT-LLM's checkpoint converter by model family "
        "and acme/secret-model names none it knows: set spec.model.family to one of llama",
    ),
    "gemma with pipeline parallelism": Old(
        "b1b95a9",
        {"model": {"name": "google/gemma-2-27b-it"}, "parallelism": {"tensor": 1, "pipeline": 2}},
        None,
        "InvalidParallelism: TensorRT-LLM's gemma converter shards tensor-parallel only: set "
        "parallelism.pipeline to 1 (or auto)",
    ),
    # Refused from 8a65745 (MultiNodeImageMissing) until multi-node pods ran NVIDIA's image too:
    # served again, on that image.
    "a layout across pods on the default image": Old(
        "8a65745",
        {
            "model": {"name": "meta-llama/Llama-3.1-405B-Instruct"},
            "parallelism": {"pipeline": 2, "tensor": 8},
        },
        None,
        SERVED,
    ),
    "an engine manifest without engine.backend": Old(
        "b4df78f",
        {"engine": {"precision": "fp8", "build": {"calibration": {"datasetUri": "pvc://calibration/cnn"}}}},
        ("spec.engine", "or set engine.backend: tensorrt-engine (engine.backend defaults to pytorch)"),
        SERVED,  # stored with the backend of its day, tensorrt-engine: its engines stay
    ),
}


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` merged into `base` key by key; a None value removes the key."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def operator_outcome(spec: dict[str, Any]) -> str:
    """What the operator makes of a stored object with this spec: SERVED, or its Stalled words."""
    body = {
        "apiVersion": "llmoperator.io/v1alpha1",
        "kind": "LLMDeployment",
        "metadata": {"name": "old", "namespace": "default", "uid": "u", "generation": 1},
        "spec": spec,
    }
    try:
        ld = LLMDeployment.model_validate(body)
    except ValidationError as e:
        return first_error(e)  # the reconciler's InvalidSpec message
    try:
        analysis = ld.spec.rollout.canary and ld.spec.rollout.canary.analysis
        if analysis:
            analysis_endpoint(analysis, ALLOWED_ANALYSIS)
        desired(ld, plan_for(ld, None), IMAGES, lambda *_: BuildObserved(BuildFact.RECORDED), models=cached)
    except PlanningError as e:
        return f"{e.reason}: {e.message}"
    return SERVED


def schema_at(path: str) -> dict[str, Any]:
    node: dict[str, Any] = crd.openapi_schema()
    for part in path.split("."):
        node = node["properties"][part.removesuffix("[]")]
        if part.endswith("[]"):
            node = node["items"]
    return node


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_an_old_manifest_is_refused_by_name_or_served_as_before(case: Old) -> None:
    spec = merged(case.base or BASE, case.spec)
    if case.rule is not None:
        path, says = case.rule
        node = schema_at(path)
        messages = [r["message"] for r in node.get("x-kubernetes-validations", [])]
        assert says in node or any(says in m for m in messages), (path, messages)
    outcome = operator_outcome(spec)
    assert case.now in outcome, outcome


def test_each_base_is_served_so_each_case_fails_on_its_own_change() -> None:
    assert operator_outcome(BASE) == SERVED
    assert operator_outcome(CPU) == SERVED
    assert operator_outcome(merged(BASE, canary())) == SERVED
    assert operator_outcome(merged(BASE, analysis(DEFAULT_PROMETHEUS_URL, maxErrorRatePercent=5))) == SERVED
