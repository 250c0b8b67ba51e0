"""Engines: the cache key, where an engine lives, and the build Job (build.py and fetch.py run in it).

An engine is valid only for one model revision, quantization, tp, pp, set of max_* limits, GPU
architecture (compute capability) and TensorRT-LLM version (NVIDIA/TensorRT-LLM#222), so all of
those make up the key; two GPU products of one architecture share engines.
"""

from __future__ import annotations

import copy
import hashlib
import json
import posixpath
import re
from typing import Any

from llm_operator import labels as L
from llm_operator.api.v1alpha1 import EngineBuild, LLMDeploymentSpec
from llm_operator.contract import ENGINE_CACHE_MOUNT
from llm_operator.engine import inputs
from llm_operator.engine.sizing import build_size
from llm_operator.images import Images
from llm_operator.plan.types import PoolPlan
from llm_operator.render import names
from llm_operator.render.inject import inject_init_container, inject_mount, inject_volume, python_path_env
from llm_operator.render.placement import node_selector_terms
from llm_operator.storage import ModelLocation, engine_location

MODEL_MOUNT = "/model-source"
WORK_MOUNT = "/work"  # scratch: HOME, caches, and the engine before it is uploaded to an object store
BUILDER_UID = 1000
EXIT_CONFIG = 78  # build.py: wrong image or GPU for this key; fetch.py: a URI it cannot use
RESTRICTED: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
}


def key_parts(
    spec: LLMDeploymentSpec, pool: PoolPlan, trtllm_version: str, model_revision: str | None = None
) -> dict[str, Any]:
    """`model_revision`: the cached model's resolved revision (the Hub's commit, the S3 objects'
    ETag digest), so new weights under the same name and revision are a new engine."""
    e = spec.engine
    parts: dict[str, Any] = {
        "model": spec.model.name,
        "revision": model_revision,
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
    if pool.world_size > pool.gpus_per_pod:
        # A world spanning pods bakes the GPUs per node into each rank's device (build.py).
        parts["gpusPerNode"] = pool.gpus_per_pod
    return {**parts, **inputs.key_parts(spec, pool)}


def cache_key(
    spec: LLMDeploymentSpec, pool: PoolPlan, trtllm_version: str, model_revision: str | None = None
) -> str:
    """Readable prefix (model, precision, tp/pp, arch) + hash of every part: a directory name."""
    parts = key_parts(spec, pool, trtllm_version, model_revision)
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]
    model = re.sub(r"[^a-z0-9]+", "-", spec.model.name.lower().rsplit("/", 1)[-1]).strip("-")[:32]
    return f"{model}-{parts['precision']}-tp{pool.tensor}pp{pool.pipeline}-{pool.sm}-{digest}"


def key_label(key: str) -> str:
    """The key as a label value (<= 63 characters, alphanumeric at both ends): the hash survives."""
    return key[-63:].lstrip("-.")


def engine_uri(spec: LLMDeploymentSpec, key: str | None) -> str:
    """Where the engine of `key` lives: the prebuilt URI as given, else one directory per key
    under engine.cache.uri."""
    if spec.engine.prebuilt is not None:
        return spec.engine.prebuilt.uri
    if key is None:
        raise ValueError("a built engine needs its cache key")
    return f"{spec.engine.cache.uri.rstrip('/')}/{key}"


def _scheduling(spec: LLMDeploymentSpec, pool: PoolPlan) -> dict[str, Any]:
    """Built on the GPU products the pool serves on (required: an engine built elsewhere fails to
    load) within the release's driver floor, with the user's node selector, tolerations and
    priority like the serving pods."""
    term = {"key": L.GPU_PRODUCT, "operator": "In", "values": list(pool.allowed_products)}
    tolerations: list[dict[str, Any]] = []
    for t in [L.GPU_TOLERATION, *spec.placement.tolerations]:
        if t not in tolerations:
            tolerations.append(dict(t))
    out: dict[str, Any] = {
        "tolerations": tolerations,
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": node_selector_terms([term], pool.driver_floor)
                }
            }
        },
    }
    if spec.placement.node_selector:
        out["nodeSelector"] = dict(spec.placement.node_selector)
    if spec.placement.priority_class_name:
        out["priorityClassName"] = spec.placement.priority_class_name
    return out


def build_job(
    deployment: str,
    namespace: str,
    spec: LLMDeploymentSpec,
    pool: PoolPlan,
    key: str,
    *,
    image: str,
    images: Images,
    owner: dict[str, Any],
    trtllm_version: str | None = None,
    model: ModelLocation | None = None,
) -> dict[str, Any]:
    """A Job that converts or quantizes the checkpoint and runs trtllm-build on the pool's GPUs,
    then (object-store caches) uploads the engine. It downloads nothing: an s3:// or hf:// model
    is read from the model cache (`model`, its claim mounted read-only, fetched before by the
    model's fetch Job), a pvc:// one in place.

    Its containers, in order: `inject` (the launcher image copies our standard-library-only
    package into an emptyDir), `fetch` (our fetch image: cache hit check and TensorRT-LLM's
    examples; engine/fetch.py), `build` (`image`, NVIDIA's tritonserver trtllm image
    of the release as published, running engine/build.py with its own python3), and for s3:// and
    gs:// caches `publish` (the fetch image again: files, then the marker). Kubernetes runs init
    containers one after another and the main container last, so the last step is the main one.

    It takes one GPU per rank, up to one pod's worth (pool.gpus_per_pod): ModelOpt calibrates the
    model sharded over them and trtllm-build builds that many ranks in parallel; a world that spans
    pods is built on one pod's GPUs, several ranks per GPU in turn. Host memory and scratch space
    come from the model's size (engine/sizing.py). pvc:// caches are written in place, the
    converted checkpoint beside them; s3:// and gs:// caches are built in the Job's scratch
    volume. With `trtllm_version`, the builder refuses an image of another TensorRT-LLM version
    (the key would lie), exit code 78, which fails the Job without retries; so do fetch and publish
    for a URI they cannot use.
    """
    build = spec.engine.build or EngineBuild()
    gpus = min(pool.world_size, pool.gpus_per_pod)
    size = build_size(spec, pool, gpus)
    labels = {**L.common_labels(deployment, "engine-build"), L.POOL: pool.name}
    model_uri = spec.model.source.uri
    common = [{"name": "work", "mountPath": WORK_MOUNT}, {"name": "tmp", "mountPath": "/tmp"}]
    build_mounts: list[dict[str, Any]] = [*common, {"name": "shm", "mountPath": "/dev/shm"}, inject_mount()]
    fetch_mounts: list[dict[str, Any]] = [*common, inject_mount()]
    work: dict[str, Any] = {"name": "work", "emptyDir": {}}
    volumes: list[dict[str, Any]] = [
        inject_volume(),
        work,
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.resources.shm_size}},
        {"name": "tmp", "emptyDir": {}},  # the root filesystem is read-only; tools write temp files
    ]
    if model is not None:  # the model cache's claim, whole, read-only
        model_uri = model.model_dir
        build_mounts.append({"name": model.volume, "mountPath": model.mount, "readOnly": True})
        volumes.append(
            {"name": model.volume, "persistentVolumeClaim": {"claimName": model.claim, "readOnly": True}}
        )
    elif model_uri.startswith("pvc://"):
        claim, _, path = model_uri.removeprefix("pvc://").partition("/")
        model_uri = f"{MODEL_MOUNT}/{path.strip('/')}".rstrip("/")
        build_mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
    else:
        raise ValueError(f"an engine build reads its model from a claim, not {model_uri}: fetch it first")
    if (calibration := inputs.calibration_volume(spec, pool)) is not None:
        build_mounts.append(calibration[0])
        volumes.append(calibration[1])
    cache = spec.engine.cache.uri
    if cache.startswith("pvc://"):
        location = engine_location(cache, key)
        output, upload = location.engine_dir, None
        # The converted checkpoint is as large as the model: keep it on the cache volume
        # (engine/sizing.py sizes it), not the node's disk.
        scratch = f"{posixpath.dirname(output)}/.scratch/{key}"
        cache_mount = {"name": "engine-cache", "mountPath": ENGINE_CACHE_MOUNT}
        build_mounts.append(cache_mount)
        fetch_mounts.append(cache_mount)
        volumes.append({"name": "engine-cache", "persistentVolumeClaim": {"claimName": location.claim}})
    else:
        output, upload, scratch = f"{WORK_MOUNT}/engine", engine_uri(spec, key), f"{WORK_MOUNT}/scratch"
        if size is not None:  # everything is in the scratch volume: the node's disk must hold it
            work["emptyDir"] = {"sizeLimit": size.scratch_quantity}
    e = spec.engine
    args = [
        "--key", key, "--model", model_uri,
        "--precision", e.precision.value, "--kv-cache-dtype", e.kv_cache_dtype.value,
        "--tp", str(pool.tensor), "--pp", str(pool.pipeline), "--gpus", str(gpus),
        "--gpus-per-node", str(pool.gpus_per_pod), "--sm", pool.sm,
        "--max-batch-size", str(e.max_batch_size), "--max-input-len", str(e.max_input_len),
        "--max-seq-len", str(e.max_seq_len), "--max-num-tokens", str(e.max_num_tokens),
        "--max-beam-width", str(e.max_beam_width), "--output", output, "--work-dir", scratch,
        *inputs.args(spec, pool),
    ]  # fmt: skip
    destination = ["--upload", upload] if upload else ["--output", output]
    fetch_args = ["fetch", "--key", key, "--work-dir", scratch, *destination]
    if upload:
        args += ["--upload", upload]
    if trtllm_version:
        args += ["--trtllm-version", trtllm_version]
        fetch_args += ["--examples-version", trtllm_version]
    user_env, user_env_from = spec.runtime.container_env()
    # No passwd entry for the uid: HOME and USER keep Python, torch and HF caches happy.
    home = [{"name": "HOME", "value": WORK_MOUNT}, {"name": "USER", "value": "builder"},
            {"name": "HF_HOME", "value": f"{WORK_MOUNT}/.cache/huggingface"}, python_path_env()]  # fmt: skip
    # The engine store's credentials come from the user's environment (the same as serving), only
    # in the containers that read or write it; the model's Secret reaches the fetch Job alone.
    store_env_from = user_env_from
    requests: dict[str, str] = {L.GPU_RESOURCE: str(gpus)}
    if size is not None:
        requests["memory"] = size.memory_quantity  # a request, no limit: a peak above it is not killed
        if upload:
            requests["ephemeral-storage"] = size.scratch_quantity
    builder: dict[str, Any] = {
        "name": "build",
        "image": image,
        "command": ["python3", "-m", "llm_operator.engine.build"],
        "args": args,
        "env": copy.deepcopy(
            [*home, {"name": "LLMOP_TRTLLM_EXAMPLES", "value": f"{scratch}/trtllm-examples"}, *user_env]
        ),
        **({"envFrom": user_env_from} if user_env_from else {}),
        "resources": {"limits": {L.GPU_RESOURCE: str(gpus)}, "requests": requests},
        "volumeMounts": copy.deepcopy(build_mounts),
        # A failed build's log tail lands in its pod status; the operator quotes it in status.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": copy.deepcopy(RESTRICTED),
    }

    def store(name: str, step_args: list[str]) -> dict[str, Any]:
        return {
            "name": name,
            "image": images.fetch,
            "command": ["python3", "-m", "llm_operator.engine.fetch"],
            "args": step_args,
            "env": copy.deepcopy([*home, *user_env]),
            **({"envFrom": store_env_from} if store_env_from else {}),
            "volumeMounts": copy.deepcopy(fetch_mounts),
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "securityContext": copy.deepcopy(RESTRICTED),
        }

    steps = [inject_init_container(images.launcher), store("fetch", fetch_args), builder]
    if upload:
        steps.append(store("publish", ["publish", "--key", key, "--work-dir", scratch, "--engine", output,
                                       "--upload", upload]))  # fmt: skip
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": names.engine_job(deployment, pool, key),
            "namespace": namespace,
            "labels": {**labels, L.ENGINE_KEY: key_label(key)},
            "ownerReferences": [owner],
        },
        "spec": {
            "backoffLimit": build.backoff_limit,
            "activeDeadlineSeconds": build.active_deadline_seconds,
            # The operator reads the outcome from the Job, so it is kept (no ttlSecondsAfterFinished).
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        # containerName matches init containers too (PodFailurePolicyOnExitCodesRequirement).
                        "onExitCodes": {
                            "containerName": step["name"],
                            "operator": "In",
                            "values": [EXIT_CONFIG],
                        },
                    }
                    for step in steps[1:]
                ]
            },
            "template": {
                # The organisation's labels and annotations go on every pod of the deployment.
                "metadata": {
                    "labels": {**spec.runtime.pod_labels, **labels, L.ENGINE_KEY: key_label(key)},
                    **({"annotations": spec.runtime.pod_annotations} if spec.runtime.pod_annotations else {}),
                },
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": BUILDER_UID,
                        "runAsGroup": BUILDER_UID,
                        "fsGroup": BUILDER_UID,
                        "fsGroupChangePolicy": "OnRootMismatch",
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    **_scheduling(spec, pool),
                    **spec.runtime.pod_identity(),
                    "initContainers": steps[:-1],
                    "containers": steps[-1:],
                    "volumes": volumes,
                },
            },
        },
    }
