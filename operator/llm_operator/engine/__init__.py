"""Engines: the cache key, the build Job, and (build.py) what the Job runs.

An engine is valid only for one model revision, quantization, tp, pp, set of max_* limits, GPU
architecture (compute capability) and TensorRT-LLM version (NVIDIA/TensorRT-LLM#222), so all of
those make up the key; two GPU products of one architecture share engines.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from llm_operator import labels as L
from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.plan.types import PoolPlan
from llm_operator.render import names
from llm_operator.render.placement import GPU_TOLERATION
from llm_operator.render.serving import ENGINE_CACHE_MOUNT, engine_location


def key_parts(spec: LLMDeploymentSpec, pool: PoolPlan, trtllm_version: str) -> dict[str, Any]:
    e = spec.engine
    return {
        "model": spec.model.name,
        "revision": spec.model.revision,
        "precision": e.precision.value,
        "kvCacheDtype": e.kv_cache_dtype.value,
        "tp": pool.tensor,
        "pp": pool.pipeline,
        "maxBatchSize": e.max_batch_size,
        "maxInputLen": e.max_input_len,
        "maxSeqLen": e.max_seq_len,
        "maxNumTokens": e.max_num_tokens,
        "maxBeamWidth": e.max_beam_width,
        "sm": pool.sm,
        "trtllm": trtllm_version,
    }


def cache_key(spec: LLMDeploymentSpec, pool: PoolPlan, trtllm_version: str) -> str:
    """Readable prefix (model, precision, tp/pp, arch) + hash of every part: a directory name."""
    parts = key_parts(spec, pool, trtllm_version)
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]
    model = re.sub(r"[^a-z0-9]+", "-", spec.model.name.lower().rsplit("/", 1)[-1]).strip("-")[:32]
    return f"{model}-{parts['precision']}-tp{pool.tensor}pp{pool.pipeline}-{pool.sm}-{digest}"


def _same_product(pool: PoolPlan) -> dict[str, Any]:
    """Engines are built on the GPU product they will serve on (the plan is per architecture)."""
    term = {"key": L.GPU_PRODUCT, "operator": "In", "values": list(pool.allowed_products)}
    return {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [term]}]
        }
    }


def build_job(
    deployment: str,
    namespace: str,
    spec: LLMDeploymentSpec,
    pool: PoolPlan,
    key: str,
    *,
    image: str,
    owner: dict[str, Any],
) -> dict[str, Any]:
    """A Job that converts the checkpoint and runs trtllm-build on the serving GPU product.

    It takes tp*pp GPUs of one node so calibration (fp8/int8/awq) and per-rank conversion run as
    they will serve; a world that spans nodes builds on one node's GPUs rank by rank instead.
    """
    location = engine_location(spec.engine.cache.uri, key)
    gpus = min(pool.world_size, pool.gpus_per_pod)
    build = spec.engine.build
    labels = {**L.common_labels(deployment, "engine-build"), L.POOL: pool.name}
    args = [
        "--model", spec.model.source.uri, "--revision", spec.model.revision,
        "--precision", spec.engine.precision.value,
        "--kv-cache-dtype", spec.engine.kv_cache_dtype.value,
        "--tp", str(pool.tensor), "--pp", str(pool.pipeline), "--sm", pool.sm,
        "--max-batch-size", str(spec.engine.max_batch_size),
        "--max-input-len", str(spec.engine.max_input_len),
        "--max-seq-len", str(spec.engine.max_seq_len), "--max-num-tokens", str(spec.engine.max_num_tokens),
        "--max-beam-width", str(spec.engine.max_beam_width), "--output", location.engine_dir, "--key", key,
    ]  # fmt: skip
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": names.engine_job(deployment, pool, key),
            "namespace": namespace,
            "labels": {**labels, L.ENGINE_KEY: key[-63:]},
            "ownerReferences": [owner],
        },
        "spec": {
            "backoffLimit": build.backoff_limit if build else 1,
            "activeDeadlineSeconds": build.active_deadline_seconds if build else 14400,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                    "tolerations": [GPU_TOLERATION],
                    "affinity": {"nodeAffinity": _same_product(pool)},
                    "containers": [
                        {
                            "name": "build",
                            "image": image,
                            "command": ["python", "-m", "llm_operator.engine.build"],
                            "args": args,
                            "resources": {
                                "limits": {L.GPU_RESOURCE: str(gpus)},
                                "requests": {L.GPU_RESOURCE: str(gpus)},
                            },
                            "volumeMounts": [
                                {"name": "engine-cache", "mountPath": ENGINE_CACHE_MOUNT},
                                {"name": "shm", "mountPath": "/dev/shm"},
                            ],
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]},
                            },
                        }
                    ],
                    "volumes": [
                        {"name": "engine-cache", "persistentVolumeClaim": {"claimName": location.claim}},
                        {
                            "name": "shm",
                            "emptyDir": {"medium": "Memory", "sizeLimit": spec.resources.shm_size},
                        },
                    ],
                },
            },
        },
    }
