"""Bad manifests are rejected by the real API server at admission, with a message naming the fix.

Each case starts from a valid LLMDeployment, breaks one thing, and asserts the CRD's schema or CEL
message (generated from the pydantic models) comes back from kube-apiserver. The dry-run creates go
through one API client, in one namespace for the module: a kubectl process and a namespace per case
cost more than the API server's own work (this module runs in the simulated GPU pools' stream).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, Client, KubeConfig
from lightkube.generic_resource import create_namespaced_resource
from llm_operator.api.v1alpha1 import (
    BUILTIN_URIS,
    HOLD_MESSAGE,
    IDLE_MESSAGE,
    ZERO_NEEDS_KEDA,
    ZERO_NEEDS_POOL,
)

from e2e.cluster.testing import Kubectl

pytestmark = pytest.mark.e2e

BASE: dict[str, Any] = {
    "apiVersion": "llmoperator.io/v1alpha1",
    "kind": "LLMDeployment",
    "metadata": {"name": "adm"},
    "spec": {
        "model": {
            "name": "meta-llama/Meta-Llama-3-8B-Instruct",
            "source": {"uri": "s3://models/llama3-8b/"},
            "cache": {"claimName": "llm-model-cache"},
            "architecture": {
                "numLayers": 32,
                "hiddenSize": 4096,
                "numAttentionHeads": 32,
                "numKeyValueHeads": 8,
                "vocabSize": 128256,
                "parameterCount": 8030000000,
            },
        },
        "engine": {
            "backend": "tensorrt-engine",
            "precision": "bf16",
            "maxInputLen": 4096,
            "maxSeqLen": 8192,
            "maxNumTokens": 8192,
        },
        "parallelism": {"tensor": 2, "pipeline": 1},
        "resources": {"gpu": {"products": ["NVIDIA-H100-80GB-HBM3"]}},
        "replicas": 1,
    },
}


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    node = doc
    for part in parents:
        node = node.setdefault(part, {})
    if value is _DELETE:
        node.pop(leaf, None)
    else:
        node[leaf] = value


_DELETE = object()

GATEWAY = {"parentRefs": [{"name": "gw", "namespace": "gateway-system"}]}
ZERO = {"provider": "keda", "minReplicas": 0, "maxReplicas": 2}
POOL = {"mode": "inference-pool"}
PROM = {"url": "http://prometheus.monitoring.svc:9090"}


def _canary_analysis(analysis: dict[str, Any]) -> dict[str, Any]:
    return {
        "strategy": "canary",
        "canary": {"steps": [{"weight": 10}], "analysis": {"prometheus": PROM, **analysis}},
    }


# A cpu-reference deployment of the builtin model, as the CPU cases change the base manifest.
CPU: dict[str, Any] = {
    "engine.backend": "cpu-reference",
    "engine.precision": "fp16",
    "parallelism": {"tensor": 1, "pipeline": 1},
    "model.source.uri": "builtin://tiny-llama",
    "model.cache": _DELETE,
    "resources": {"cpu": "100m"},
}

# (case id, {dotted path under spec: value}, expected message fragment)
INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("world-size", {"parallelism": {"tensor": 64, "pipeline": 2}}, "tensor * pipeline must not exceed 64"),
    ("tp-not-power-of-two", {"parallelism.tensor": 3}, "must be a power of two"),
    ("tp-not-a-number", {"parallelism.tensor": "many"}, "must be an integer from 1 to 64, or 'auto'"),
    (
        "tp-divides-heads",
        {
            "parallelism.tensor": 64,
            "model.architecture.numAttentionHeads": 32,
            "model.architecture.numKeyValueHeads": 32,
        },
        "parallelism.tensor must divide model.architecture.numAttentionHeads",
    ),
    (
        "pp-divides-layers",
        {"parallelism.pipeline": 8, "model.architecture.numLayers": 30},
        "parallelism.pipeline must divide model.architecture.numLayers",
    ),
    (
        "hidden-vs-heads",
        {"model.architecture.hiddenSize": 4100},
        "hiddenSize must be divisible by numAttentionHeads",
    ),
    ("gqa-heads", {"model.architecture.numKeyValueHeads": 5}, "must be a multiple of numKeyValueHeads"),
    (
        "min-max-replicas",
        {"autoscaling": {"minReplicas": 5, "maxReplicas": 2}},
        "autoscaling.minReplicas must be <= autoscaling.maxReplicas",
    ),
    (
        "hpa-target-not-quantity",
        {"autoscaling": {"maxReplicas": 2, "target": "lots"}},
        "must be a Kubernetes quantity",
    ),
    (
        "canary-weights-decrease",
        {"rollout": {"strategy": "canary", "canary": {"steps": [{"weight": 50}, {"weight": 10}]}}},
        "weights must increase strictly",
    ),
    (
        "canary-weight-over-100",
        {"rollout": {"strategy": "canary", "canary": {"steps": [{"weight": 150}]}}},
        "less than or equal to 100",
    ),
    (
        "canary-missing",
        {"rollout": {"strategy": "canary"}},
        "rollout.canary is required when rollout.strategy is canary",
    ),
    (
        "canary-gateway-api-without-gateway",
        {
            "rollout": {
                "strategy": "canary",
                "canary": {"steps": [{"weight": 10}], "trafficRouting": "gateway-api"},
            }
        },
        "rollout.canary.gateway.parentRefs is required with trafficRouting gateway-api",
    ),
    (
        "canary-gateway-without-gateway-api",
        {"rollout": {"strategy": "canary", "canary": {"steps": [{"weight": 10}], "gateway": GATEWAY}}},
        "rollout.canary.gateway is used only with trafficRouting gateway-api",
    ),
    (
        "picker-without-inference-pool",
        {"routing": {"mode": "service", "picker": {"failureMode": "FailOpen"}}},
        "routing.picker is used only with routing.mode inference-pool",
    ),
    (
        "gateway-api-canary-with-inference-pool",
        {
            "routing": {"mode": "inference-pool"},
            "rollout": {
                "strategy": "canary",
                "canary": {"steps": [{"weight": 10}], "trafficRouting": "gateway-api", "gateway": GATEWAY},
            },
        },
        "use trafficRouting replica-ratio",
    ),
    (
        "picker-failure-mode-unknown",
        {"routing": {"mode": "inference-pool", "picker": {"failureMode": "FailSometimes"}}},
        "Unsupported value",
    ),
    (
        "canary-gateway-no-parents",
        {
            "rollout": {
                "strategy": "canary",
                "canary": {
                    "steps": [{"weight": 10}],
                    "trafficRouting": "gateway-api",
                    "gateway": {"parentRefs": []},
                },
            }
        },
        "should have at least 1 items",
    ),
    (
        "canary-analysis-without-bound",
        {
            "rollout": {
                "strategy": "canary",
                "canary": {"steps": [{"weight": 10}], "analysis": {"prometheus": PROM}},
            }
        },
        "rollout.canary.analysis needs at least one bound to check",
    ),
    (
        "canary-analysis-interval-too-short",
        {"rollout": _canary_analysis({"intervalSeconds": 1, "maxErrorRatePercent": 1})},
        "greater than or equal to 10",
    ),
    (
        "canary-analysis-min-requests-zero",
        {"rollout": _canary_analysis({"minRequests": 0, "maxErrorRatePercent": 1})},
        "greater than or equal to 1",
    ),
    (
        "canary-pause-negative",
        {"rollout": {"strategy": "canary", "canary": {"steps": [{"weight": 10, "pauseSeconds": -1}]}}},
        "greater than or equal to 0",
    ),
    (
        "canary-too-many-steps",
        {"rollout": {"strategy": "canary", "canary": {"steps": [{"weight": w} for w in range(1, 22)]}}},
        "must have at most 20 items",
    ),
    (
        "env-reserved",
        {"runtime": {"env": [{"name": "LLMOP_TP", "value": "8"}]}},
        "LLMOP_* variables are the operator's pod contract",
    ),
    (
        "env-value-and-value-from",
        {
            "runtime": {
                "env": [{"name": "A", "value": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
            }
        },
        "an env entry takes value or valueFrom",
    ),
    (
        "env-from-two-sources",
        {"runtime": {"envFrom": [{"secretRef": {"name": "a"}, "configMapRef": {"name": "b"}}]}},
        "envFrom takes exactly one of secretRef and configMapRef",
    ),
    (
        "pod-label-reserved",
        {"runtime": {"podLabels": {"llmoperator.io/pool": "x"}}},
        "are set by the operator",
    ),
    (
        "fp8-on-ampere",
        {"engine.precision": "fp8", "resources.gpu.products": ["NVIDIA-A100-SXM4-40GB"]},
        "fp8 (weights or KV cache) requires an Ada/Hopper-or-newer GPU product",
    ),
    (
        "fp8-kv-in-pools",
        {
            "engine.kvCacheDtype": "fp8",
            "resources.gpu": {
                "pools": [
                    {"name": "h100", "products": ["NVIDIA-H100-80GB-HBM3"]},
                    {"name": "a10", "products": ["NVIDIA-A10G"]},
                ]
            },
        },
        "requires Ada/Hopper-or-newer GPU products in every pool",
    ),
    ("seq-below-input", {"engine.maxSeqLen": 1024}, "engine.maxSeqLen must be at least engine.maxInputLen"),
    (
        "tokens-below-input",
        {"engine.maxNumTokens": 1024},
        "engine.maxNumTokens must be >= engine.maxInputLen",
    ),
    ("prebuilt-and-build", {"engine.prebuilt": {"uri": "pvc://cache/x"}, "engine.build": {}}, "not both"),
    (
        "calibration-from-s3",
        {"engine.build": {"calibration": {"datasetUri": "s3://datasets/cnn"}}},
        "engine.build.calibration.datasetUri must be pvc://CLAIM/PATH",
    ),
    ("unknown-family", {"model.family": "mamba"}, "Unsupported value"),
    (
        "alias-is-the-name",
        {"model.alias": "meta-llama/Meta-Llama-3-8B-Instruct"},
        "model.alias names the model a second time",
    ),
    ("alias-two-names", {"model.alias": "llama,llama-3"}, "should match"),
    (
        "model-uri-scheme",
        {"model.source.uri": "http://example.com/model"},
        "model.source.uri must start with s3://, pvc://, hf:// or builtin://",
    ),
    (
        "cache-uri-scheme",
        {"engine.cache": {"uri": "file:///var/engines"}},
        "must be pvc://CLAIM/PATH (a ReadWriteMany PersistentVolumeClaim)",
    ),
    (
        "tokenizer-uri-scheme",
        {"runtime.tokenizerUri": "s3://models/llama3-8b/tokenizer"},
        "runtime.tokenizerUri must be pvc://CLAIM/PATH: serving pods mount the tokenizer read-only",
    ),
    (
        "builtin-needs-cpu",
        {"model.source.uri": "builtin://tiny-llama"},
        "builtin:// models exist only in the cpu-reference backend",
    ),
    (
        "cpu-needs-builtin",
        {
            "engine.backend": "cpu-reference",
            "engine.precision": "fp16",
            "parallelism": {"tensor": 1, "pipeline": 1},
            "model.source.uri": "builtin://no-such-model",
            "model.cache": _DELETE,
        },
        f"the cpu-reference backend serves its builtin models ({' or '.join(BUILTIN_URIS)}) or a checkpoint",
    ),
    (
        "cpu-backend-parallel",
        {"engine.backend": "cpu-reference", "engine.precision": "fp16"},
        "the cpu-reference backend runs on CPU",
    ),
    (
        "pytorch-no-engines",
        {
            "engine.backend": "pytorch",
            "model.source.uri": "hf://meta-llama/Meta-Llama-3-8B-Instruct",
            "engine.prebuilt": {"uri": "pvc://cache/x"},
        },
        "the pytorch backend loads the checkpoint itself and builds no engine",
    ),
    (
        "pytorch-quantized",
        {
            "engine.backend": "pytorch",
            "model.source.uri": "pvc://models/llama",
            "model.cache": _DELETE,
            "engine.precision": "fp8",
        },
        "the pytorch backend serves the checkpoint as stored",
    ),
    (
        "pytorch-queue-bound",
        {
            "engine.backend": "pytorch",
            "model.source.uri": "pvc://models/llama",
            "model.cache": _DELETE,
            "runtime": {"batching": {"maxQueueSize": 64}},
        },
        "the pytorch backend batches and queues inside TensorRT-LLM's LLM API",
    ),
    (
        "pytorch-kv-host-memory",
        {
            "engine.backend": "pytorch",
            "model.source.uri": "pvc://models/llama",
            "model.cache": _DELETE,
            "runtime": {"kvCache": {"blockReuse": False, "hostMemoryBytes": 1 << 30}},
        },
        "remove runtime.batching and runtime.kvCache.hostMemoryBytes",
    ),
    (
        "cpu-kv-cache",
        {**CPU, "runtime": {"kvCache": {"freeGpuMemoryPercent": 50}}},
        "the cpu-reference backend decodes each batch whole and has no KV-cache pool",
    ),
    (
        "cpu-scheduler-policy",
        {**CPU, "runtime": {"batching": {"maxQueueSize": 8, "schedulerPolicy": "max-utilization"}}},
        "remove runtime.batching.strategy, .schedulerPolicy, runtime.kvCache and runtime.chunkedContext",
    ),
    (
        "cpu-contract-elsewhere",
        {
            "engine.backend": "pytorch",
            "model.source.uri": "pvc://models/llama",
            "model.cache": _DELETE,
            "engine.cpuReference": {"contract": "pytorch"},
        },
        "engine.cpuReference applies to the cpu-reference backend only",
    ),
    (
        "engine-build-on-the-default-backend",
        {"engine.backend": _DELETE, "engine.build": {}},
        "or set engine.backend: tensorrt-engine (engine.backend defaults to pytorch)",
    ),
    (
        "products-and-pools",
        {"resources.gpu.pools": [{"name": "a", "products": ["NVIDIA-L40S"]}]},
        "set resources.gpu.products (one pool) or resources.gpu.pools, not both",
    ),
    (
        "pool-weight-zero",
        {"resources.gpu": {"pools": [{"name": "a", "products": ["NVIDIA-L40S"], "weight": 0}]}},
        "greater than or equal to 1",
    ),
    (
        "duplicate-pools",
        {
            "resources.gpu": {
                "pools": [
                    {"name": "a", "products": ["NVIDIA-L40S"]},
                    {"name": "a", "products": ["NVIDIA-A10G"]},
                ]
            }
        },
        "Duplicate value",
    ),
    (
        "pool-named-like-a-slot",
        {"resources.gpu": {"pools": [{"name": "b-east", "products": ["NVIDIA-L40S"]}]}},
        "pool names b, b-*, stable and canary are reserved",
    ),
    # Scale to zero (docs/autoscaling.md): each refusal says what to change.
    ("zero-without-the-pool", {"autoscaling": ZERO}, ZERO_NEEDS_POOL),
    ("zero-with-the-hpa", {"autoscaling": {**ZERO, "provider": "hpa"}, "routing": POOL}, ZERO_NEEDS_KEDA),
    (
        "zero-holding-nothing",
        {"autoscaling": {**ZERO, "scaleToZero": {"holdSeconds": 0}}, "routing": POOL},
        HOLD_MESSAGE,
    ),
    (
        "zero-idle-shorter-than-scrapes",
        {"autoscaling": {**ZERO, "scaleToZero": {"idleSeconds": 15}}, "routing": POOL},
        IDLE_MESSAGE,
    ),
    (
        "scale-to-zero-above-zero",
        {"autoscaling": {**ZERO, "minReplicas": 1, "scaleToZero": {}}, "routing": POOL},
        "autoscaling.scaleToZero applies only with autoscaling.minReplicas 0",
    ),
    ("unknown-precision", {"engine.precision": "fp4"}, "Unsupported value"),
    ("kv-percent", {"runtime": {"kvCache": {"freeGpuMemoryPercent": 120}}}, "less than or equal to 99"),
]


def _manifest(changes: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    for path, value in changes.items():
        _set(doc["spec"], path, value)
    return doc


LLMDeploymentResource = create_namespaced_resource(
    "llmoperator.io", "v1alpha1", "LLMDeployment", "llmdeployments"
)


@pytest.fixture(scope="module")
def api(kubeconfig: Path) -> Client:
    return Client(config=KubeConfig.from_file(kubeconfig), field_manager="e2e-tests")


@pytest.fixture(scope="module")
def space(kubectl: Kubectl) -> Iterator[str]:
    """The module's namespace: dry runs leave nothing in it."""
    name = kubectl.create_namespace("admission")
    yield name
    kubectl.delete("namespace", name)


def _create(api: Client, namespace: str, doc: dict[str, Any], dry_run: bool = True) -> None:
    api.create(LLMDeploymentResource.from_dict(doc), namespace=namespace, dry_run=dry_run)


def _update(api: Client, namespace: str, doc: dict[str, Any]) -> None:
    """Server-side apply: no resourceVersion precondition to lose to a status write."""
    doc = {**doc, "metadata": {**doc["metadata"], "namespace": namespace}}
    api.apply(LLMDeploymentResource.from_dict(doc), force=True)


def _refusal(err: pytest.ExceptionInfo[ApiError]) -> str:
    """What the API server said, as kubectl prints it."""
    return str(err.value.status.message)


def test_base_manifest_is_valid(crd: None, api: Client, space: str) -> None:
    _create(api, space, _manifest({}))


def test_the_batching_fields_each_backend_takes_are_accepted(crd: None, api: Client, space: str) -> None:
    cpu = {"batching": {"maxQueueDelayMicroseconds": 100, "maxQueueSize": 8}}
    _create(api, space, _manifest({**CPU, "runtime": cpu}))
    pytorch = {
        "chunkedContext": True,
        "kvCache": {"freeGpuMemoryPercent": 80, "maxTokens": 4096, "blockReuse": True},
    }
    source = {"engine.backend": "pytorch", "model.source.uri": "pvc://models/llama", "model.cache": _DELETE}
    _create(api, space, _manifest({**source, "runtime": pytorch}))


@pytest.mark.parametrize(
    "source",
    [
        {"uri": "pvc://models/llama3-8b"},
        {"uri": "hf://meta-llama/Meta-Llama-3-8B-Instruct", "credentialsSecretRef": {"name": "hf-token"}},
        {"uri": "s3://models/llama3-8b/"},
    ],
    ids=["pvc", "hf", "s3"],
)
def test_pytorch_backend_is_accepted(crd: None, api: Client, space: str, source: dict[str, Any]) -> None:
    cache = {} if source["uri"].startswith(("hf://", "s3://")) else {"model.cache": _DELETE}
    _create(api, space, _manifest({"engine.backend": "pytorch", "model.source": source, **cache}))


@pytest.mark.parametrize(
    "rollout",
    [
        {"strategy": "canary", "canary": {"steps": [{"weight": 10, "pauseSeconds": 60}, {"weight": 50}]}},
        {
            "strategy": "canary",
            "canary": {
                "steps": [{"weight": 20, "pauseSeconds": 0}, {"weight": 100, "pauseSeconds": 30}],
                "trafficRouting": "gateway-api",
                "gateway": {
                    "parentRefs": [{"name": "gw", "namespace": "gateway-system", "sectionName": "http"}]
                },
                "abortScaleDownDelaySeconds": 0,
                "analysis": {
                    "prometheus": PROM,
                    "intervalSeconds": 30,
                    "initialDelaySeconds": 10,
                    "minRequests": 5,
                    "failureLimit": 1,
                    "inconclusiveLimit": 2,
                    "consecutiveErrorLimit": 3,
                    "maxErrorRatePercent": 1,
                    "maxP99LatencyMilliseconds": 800,
                    "maxTimeToFirstTokenMilliseconds": 1000,
                    "maxMeanQueueTimeMilliseconds": 200,
                },
            },
        },
    ],
    ids=["replica-ratio", "gateway-api-analysis"],
)
def test_canary_rollout_is_accepted(crd: None, api: Client, space: str, rollout: dict[str, Any]) -> None:
    _create(api, space, _manifest({"rollout": rollout}))


def test_inference_pool_routing_with_a_replica_ratio_canary_is_accepted(
    crd: None, api: Client, space: str
) -> None:
    routing = {"mode": "inference-pool", "picker": {"failureMode": "FailOpen"}}
    rollout = {"strategy": "canary", "canary": {"steps": [{"weight": 10}], "trafficRouting": "replica-ratio"}}
    _create(api, space, _manifest({"routing": routing, "rollout": rollout}))


def test_scale_to_zero_through_the_pool_with_keda_is_accepted(crd: None, api: Client, space: str) -> None:
    hold = {"idleSeconds": 30, "holdSeconds": 900, "maxHeldRequests": 10000}
    zeros: list[dict[str, Any]] = [{}, {"scaleToZero": {}}, {"scaleToZero": hold}]
    for zero in zeros:
        _create(api, space, _manifest({"autoscaling": {**ZERO, **zero}, "routing": POOL}))


@pytest.mark.parametrize("dataset", ["pvc://llm-calibration/cnn_dailymail", "hf://abisee/cnn_dailymail"])
def test_calibration_datasets_and_families_are_accepted(
    crd: None, api: Client, space: str, dataset: str
) -> None:
    calibration = {"engine.build": {"calibration": {"datasetUri": dataset, "size": 256}}}
    _create(api, space, _manifest({**calibration, "engine.precision": "fp8", "model.family": "llama"}))


@pytest.mark.parametrize(("changes", "message"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_manifest_rejected(
    crd: None, api: Client, space: str, changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(ApiError) as err:
        _create(api, space, _manifest(changes))
    assert message in _refusal(err), _refusal(err)


def test_model_name_is_immutable(crd: None, api: Client, namespace: str) -> None:
    """A real object (the module's other cases are dry runs), in a namespace of its own."""
    _create(api, namespace, _manifest({}), dry_run=False)
    changed = _manifest({"model.name": "meta-llama/Meta-Llama-3-70B-Instruct"})
    with pytest.raises(ApiError) as err:
        _update(api, namespace, changed)
    assert "model.name is immutable" in _refusal(err)
    # Changing a field that means the same model (new weights under a new prefix) is allowed.
    upgraded = _manifest({"model.source.uri": "s3://models/llama3-8b-v2/"})
    _update(api, namespace, upgraded)
    stored = api.get(LLMDeploymentResource, "adm", namespace=namespace)
    assert stored["spec"]["model"]["source"]["uri"] == "s3://models/llama3-8b-v2/"
