"""The serving pod template: Triton's container, its volumes and security, and the labels that
say which revision it serves and when it must roll (render/serving.py runs it as StatefulSets or
LeaderWorkerSets).
"""

from __future__ import annotations

import hashlib
import json
import re
from decimal import ROUND_CEILING, Decimal
from typing import Any

from llm_operator import contract
from llm_operator import labels as L
from llm_operator.api.v1alpha1 import Backend, LLMDeploymentSpec
from llm_operator.images import Images
from llm_operator.modelrepo import sequence_limits, speaks_llmapi
from llm_operator.plan.types import PoolPlan
from llm_operator.render import names
from llm_operator.render.inject import inject_init_container, inject_mount, inject_volume, python_path_env
from llm_operator.render.placement import pod_scheduling
from llm_operator.render.startup_cache import startup_cache
from llm_operator.rollout.revision import Slot
from llm_operator.runtime.cpu_reference import PACKAGED_MODELS, packaged_dir
from llm_operator.storage import EngineLocation, ModelLocation, tokenizer_dir, tokenizer_location


def template_hash(obj: Any) -> str:
    """Short stable hash: pods roll when (and only when) what they run changes."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:10]


# Kubernetes quantity suffixes of memory sizes.
_SUFFIX = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}  # fmt: skip
# Mode of the files of the Secret volumes (launch identities, API keys): owner and the pod's fsGroup (the
# kubelet adds group read anyway when it applies an fsGroup to a Secret volume), nobody else.
SECRET_FILE_MODE = 0o440
# The group that may read them: Secret volume files belong to root, so a non-root container user
# reads them through this supplementary group only.
SECRET_FS_GROUP = 1000
# NVIDIA's images run as root unless told otherwise: their pods run as uid 1000, Triton's own
# non-root user `triton-server` (triton-inference-server/server build.py creates it with uid and gid
# 1000, removing Ubuntu's `ubuntu`). The cpu-runtime image names its own non-root USER.
NVIDIA_UID = 1000
STARTUP_PROBE_PERIOD_SECONDS = 2


def serving_image(spec: LLMDeploymentSpec, images: Images) -> str:
    """spec.runtime.image, else the operator's: NVIDIA's image of the deployment's release, or the
    cpu-runtime image; a layout spanning pods runs the same image (its ranks start through the
    operator's launch agent, docs/launcher-and-engines.md)."""
    if spec.runtime.image:
        return spec.runtime.image
    if spec.engine.backend == Backend.CPU_REFERENCE:
        return images.cpu_runtime
    return images.runtime


def memory_bytes(quantity: str) -> int:
    """Bytes of a memory quantity ("2Gi", "256M", "1e9"); admission has checked isQuantity."""
    m = re.fullmatch(r"([0-9.]+(?:[eE][-+]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?", quantity)
    if m is None:
        raise ValueError(f"not a memory quantity: {quantity}")
    number, suffix = Decimal(m.group(1)), m.group(2) or ""
    value = number / 1000 if suffix == "m" else number * _SUFFIX[suffix]
    return int(value.to_integral_value(rounding=ROUND_CEILING))


def _size(n: int) -> str:
    for suffix in ("Gi", "Mi", "Ki"):
        if n % _SUFFIX[suffix] == 0:
            return f"{n // _SUFFIX[suffix]}{suffix}"
    return str(n)


def _env(
    spec: LLMDeploymentSpec, pool: PoolPlan, engine: EngineLocation | None, model: ModelLocation | None
) -> list[dict[str, Any]]:
    """What every serving container gets (contract.ENV); multi-node pods add their role and group
    addressing (workloads)."""
    env: list[dict[str, Any]] = [
        {"name": contract.POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "LLMOP_BACKEND", "value": spec.engine.backend.value},
        *(
            [{"name": "LLMOP_CONTRACT", "value": "pytorch"}]
            if speaks_llmapi(spec) and spec.engine.backend == Backend.CPU_REFERENCE
            else []
        ),
        {"name": "LLMOP_TP", "value": str(pool.tensor)},
        {"name": "LLMOP_PP", "value": str(pool.pipeline)},
        {"name": "LLMOP_GPUS_PER_POD", "value": str(pool.gpus_per_pod)},
        {"name": "LLMOP_PODS_PER_REPLICA", "value": str(pool.pods_per_replica)},
        {"name": "LLMOP_MODEL_REPO_SRC", "value": contract.MODEL_REPO_SRC},
        {"name": "LLMOP_MODEL_REPO", "value": contract.MODEL_REPO},
        {"name": "LLMOP_HTTP_PORT", "value": str(contract.HTTP_PORT)},
        {"name": "LLMOP_GRPC_PORT", "value": str(contract.GRPC_PORT)},
        {"name": "LLMOP_METRICS_PORT", "value": str(contract.METRICS_PORT)},
        {"name": "LLMOP_OPENAI_PORT", "value": str(contract.OPENAI_PORT)},
        {"name": "LLMOP_EXIT_TIMEOUT_SECONDS", "value": str(spec.runtime.exit_timeout_seconds)},
        # The root filesystem is read-only: mpirun and Python's caches write under HOME.
        {"name": "HOME", "value": contract.HOME_DIR},
        python_path_env(),  # the launcher, copied in by the init container
    ]
    if engine is not None:
        env.append({"name": "LLMOP_ENGINE_DIR", "value": engine.engine_dir})
    if model is not None:
        env.append({"name": "LLMOP_MODEL_DIR", "value": model.model_dir})
    tokenizer = tokenizer_dir(tokenizer_location(spec.runtime.tokenizer_uri), engine, model)
    if not tokenizer and spec.engine.backend == Backend.CPU_REFERENCE:  # in the cpu-runtime image
        builtin = spec.model.source.uri.removeprefix("builtin://")
        packaged = builtin in PACKAGED_MODELS
        tokenizer = packaged_dir(builtin) if packaged else contract.CPU_REFERENCE_TOKENIZER_DIR
    if tokenizer:  # the launcher refuses to start without a tokenizer there
        env.append({"name": "LLMOP_TOKENIZER_DIR", "value": tokenizer})
    return env


def served_names(spec: LLMDeploymentSpec) -> list[str]:
    """What the OpenAI API serves the model as: model.name, then model.alias."""
    return [spec.model.name, *([spec.model.alias] if spec.model.alias else [])]


def front_door_env(spec: LLMDeploymentSpec) -> list[dict[str, str]]:
    """The leader's OpenAI API: the names it serves, the limits it checks requests against, where
    its API keys are (spec.routing.apiKeys) and its tool-call parser (spec.model.toolCallParser)."""
    max_input_len, max_seq_len = sequence_limits(spec)
    env = [
        {"name": "LLMOP_SERVED_MODEL_NAMES", "value": ",".join(served_names(spec))},
        {"name": "LLMOP_MAX_INPUT_LEN", "value": str(max_input_len)},
        {"name": "LLMOP_MAX_SEQ_LEN", "value": str(max_seq_len)},
    ]
    if api_keys_secret(spec):
        env.append({"name": "LLMOP_API_KEYS_DIR", "value": contract.API_KEYS_DIR})
    if spec.model.tool_call_parser is not None:
        env.append({"name": "LLMOP_TOOL_CALL_PARSER", "value": spec.model.tool_call_parser.value})
    return env


def api_keys_secret(spec: LLMDeploymentSpec) -> str | None:
    keys = spec.routing.api_keys
    return keys.secret_ref.name if keys is not None else None


def _container(
    spec: LLMDeploymentSpec,
    pool: PoolPlan,
    images: Images,
    engine: EngineLocation | None,
    *,
    leader: bool,
    extra_env: list[dict[str, Any]],
    model: ModelLocation | None,
) -> dict[str, Any]:
    cpu = spec.engine.backend == Backend.CPU_REFERENCE
    resources: dict[str, Any] = {}
    requests: dict[str, str] = {}
    if spec.resources.cpu:
        requests["cpu"] = spec.resources.cpu
    if spec.resources.memory:
        requests["memory"] = spec.resources.memory
    limits: dict[str, str] = {}
    if spec.resources.memory:
        # /dev/shm is a memory-backed emptyDir: what Triton's python backend and NCCL write there
        # is charged to the pod's memory. The limit leaves room for a full shm on top of what the
        # processes are sized for, so a limit cannot kill a pod that stays within both.
        limits["memory"] = _size(memory_bytes(spec.resources.memory) + memory_bytes(spec.resources.shm_size))
    if not cpu:
        # Extended resources need limits == requests.
        limits[L.GPU_RESOURCE] = requests[L.GPU_RESOURCE] = str(pool.gpus_per_pod)
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    mounts = [
        {"name": "model-repo-src", "mountPath": contract.MODEL_REPO_SRC, "readOnly": True},
        {"name": "model-repo", "mountPath": contract.MODEL_REPO},
        {"name": "shm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": contract.TMP_DIR},
        {"name": "home", "mountPath": contract.HOME_DIR},
        inject_mount(),
    ]
    if engine is not None:
        mounts.append({"name": "engine-cache", "mountPath": contract.ENGINE_CACHE_MOUNT, "readOnly": True})
    if spec.runtime.tokenizer_uri is not None:
        mounts.append({"name": "tokenizer", "mountPath": contract.TOKENIZER_MOUNT, "readOnly": True})
    if model is not None:  # the whole claim: a missing directory reaches the launcher's check
        mounts.append({"name": model.volume, "mountPath": model.mount, "readOnly": True})
    if pool.pods_per_replica > 1:
        mounts.append(
            {"name": contract.LAUNCH_VOLUME, "mountPath": contract.LAUNCH_IDENTITY_DIR, "readOnly": True}
        )
    if leader and api_keys_secret(spec):
        mounts.append(
            {"name": contract.API_KEYS_VOLUME, "mountPath": contract.API_KEYS_DIR, "readOnly": True}
        )
    user_env, user_env_from = spec.runtime.container_env()
    container: dict[str, Any] = {
        "name": "triton",
        "image": serving_image(spec, images),
        "command": list(contract.CONTAINER_COMMAND),
        # Only rank 0 serves the OpenAI API.
        "env": _env(spec, pool, engine, model)
        + (front_door_env(spec) if leader else [])
        + extra_env
        + user_env,
        "ports": [
            {"name": "http", "containerPort": contract.HTTP_PORT},
            {"name": "grpc", "containerPort": contract.GRPC_PORT},
            {"name": "metrics", "containerPort": contract.METRICS_PORT},
            {"name": "openai", "containerPort": contract.OPENAI_PORT},
        ],
        "volumeMounts": mounts,
        # Where the launcher writes why it stopped (e.g. the missing file, exit 78); a runtime that
        # dies before writing one leaves the tail of its log there instead: the operator quotes it
        # in status (kubectl logs is not needed to see why).
        "terminationMessagePath": contract.TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # Everything written goes to an emptyDir: the model repository, /tmp (the launcher's
        # runtime dir, Triton's python backend, Open MPI's session dir), /dev/shm and HOME.
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
        },
    }
    if user_env_from:
        container["envFrom"] = user_env_from
    if resources:
        container["resources"] = resources
    if leader:
        # Only rank 0 serves: probes belong to the leader. Started means the OpenAI front door
        # answers too (its /health asks Triton, and no API key): the two start side by side, and a
        # pod must not join its Service with a closed OpenAI port. Asked every 2 s, since the probe
        # period is added to every cold start. Then readiness asks Triton alone, so a front door
        # busy with a request does not take the pod out of its Service (the launcher takes a front
        # door that exits down with the pod).
        container["startupProbe"] = {
            "httpGet": {"path": "/health", "port": "openai"},
            "periodSeconds": STARTUP_PROBE_PERIOD_SECONDS,
            "failureThreshold": spec.runtime.startup_timeout_seconds // STARTUP_PROBE_PERIOD_SECONDS,
        }
        container["readinessProbe"] = {
            "httpGet": {"path": "/v2/health/ready", "port": "http"},
            "periodSeconds": 5,
            "failureThreshold": 2,
        }
        container["livenessProbe"] = {
            "httpGet": {"path": "/v2/health/live", "port": "http"},
            "periodSeconds": 10,
            "failureThreshold": 3,
        }
    # Workers drain too: they wait on their leader's requests, so their ranks outlive them.
    container["lifecycle"] = {"preStop": {"exec": {"command": list(contract.PRESTOP_COMMAND)}}}
    return container


def _volumes(
    spec: LLMDeploymentSpec,
    pool: PoolPlan,
    deployment: str,
    engine: EngineLocation | None,
    repo_hash: str,
    launch_secret: str,
    slot: Slot,
    *,
    leader: bool,
    model: ModelLocation | None,
) -> list[dict[str, Any]]:
    repo = names.model_repo(deployment, pool, repo_hash, slot)
    volumes: list[dict[str, Any]] = [
        {"name": "model-repo-src", "configMap": {"name": repo}},
        {"name": "model-repo", "emptyDir": {}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.resources.shm_size}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "home", "emptyDir": {}},
        inject_volume(),
    ]
    if engine is not None:
        volumes.append(
            {
                "name": "engine-cache",
                "persistentVolumeClaim": {"claimName": engine.claim, "readOnly": True},
            }
        )
    tokenizer = tokenizer_location(spec.runtime.tokenizer_uri)
    if tokenizer is not None:
        volumes.append(
            {"name": "tokenizer", "persistentVolumeClaim": {"claimName": tokenizer.claim, "readOnly": True}}
        )
    if model is not None:
        volumes.append(
            {"name": model.volume, "persistentVolumeClaim": {"claimName": model.claim, "readOnly": True}}
        )
    if pool.pods_per_replica > 1:
        # The deployment's launch identity (the controller creates the Secret), each role only its
        # half: a leader holds its own key and the workers' certificate, a worker the reverse.
        keys = contract.LEADER_LAUNCH_FILES if leader else contract.WORKER_LAUNCH_FILES
        volumes.append(
            {
                "name": contract.LAUNCH_VOLUME,
                "secret": {
                    "secretName": launch_secret,
                    "defaultMode": SECRET_FILE_MODE,
                    "items": [{"key": k, "path": k} for k in keys],
                },
            }
        )
    secret = api_keys_secret(spec)
    if leader and secret:  # every key of the Secret, updated in place by the kubelet (no items)
        volumes.append(
            {
                "name": contract.API_KEYS_VOLUME,
                "secret": {"secretName": secret, "defaultMode": SECRET_FILE_MODE},
            }
        )
    return volumes


def pod_template(
    spec: LLMDeploymentSpec,
    pool: PoolPlan,
    deployment: str,
    images: Images,
    engine: EngineLocation | None,
    *,
    pod_labels: dict[str, str],
    group_selector: dict[str, str] | None,
    leader: bool,
    extra_env: list[dict[str, Any]],
    repo_hash: str,
    launch_secret: str,
    slot: Slot,
    revision: str,
    group_label_keys: tuple[str, ...] = (),
    model: ModelLocation | None = None,
) -> dict[str, Any]:
    # Leaders spread over the whole pool, both slots: they are one deployment's replicas.
    selector = {**L.selector_labels(deployment), L.POOL: pool.name}
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": contract.termination_grace_seconds(
            spec.runtime.exit_timeout_seconds
        ),
        # Restricted Pod Security: the kubelet checks runAsNonRoot against the numeric user (the
        # cpu-runtime and launcher images name one, NVIDIA's are given NVIDIA_UID).
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "initContainers": [inject_init_container(images.launcher)],
        "containers": [
            _container(spec, pool, images, engine, leader=leader, extra_env=extra_env, model=model)
        ],
        "volumes": _volumes(
            spec, pool, deployment, engine, repo_hash, launch_secret, slot, leader=leader, model=model
        ),
        **spec.runtime.pod_identity(),
    }
    if spec.engine.backend != Backend.CPU_REFERENCE:
        pod_spec["securityContext"].update(runAsUser=NVIDIA_UID, runAsGroup=NVIDIA_UID)
    if pool.pods_per_replica > 1 or (leader and api_keys_secret(spec)):
        # The Secret volumes' group (launch identities, API keys). OnRootMismatch: a volume whose root
        # already has the group is not walked again (the engine cache is large, and read-only).
        pod_spec["securityContext"].update(fsGroup=SECRET_FS_GROUP, fsGroupChangePolicy="OnRootMismatch")
    if cache := startup_cache(spec, pool, serving_image(spec, images), images.trtllm_version, model):
        cache.add_to(pod_spec)
    if spec.engine.backend != Backend.CPU_REFERENCE:
        pod_spec.update(
            pod_scheduling(
                spec,
                pool,
                selector=selector,
                group_selector=group_selector,
                group_label_keys=group_label_keys,
                leader=leader,
            )
        )
    else:
        for key, value in (
            ("nodeSelector", spec.placement.node_selector),
            ("tolerations", list(spec.placement.tolerations)),
            ("priorityClassName", spec.placement.priority_class_name),
        ):
            if value:
                pod_spec[key] = value
    # The user's labels first: the operator's own keys always win (admission refuses the reserved
    # prefixes anyway). A changed model repository changes the ConfigMap's name in the volumes.
    labels = {**spec.runtime.pod_labels, **pod_labels}
    template: dict[str, Any] = {"metadata": {"labels": labels}, "spec": pod_spec}
    if spec.runtime.pod_annotations:
        template["metadata"]["annotations"] = dict(spec.runtime.pod_annotations)
    # The revision says what the pod serves (routing, analysis, metrics); the template hash, taken
    # before both labels are added, is what rolls the pods (it also covers the plan's placement).
    template["metadata"]["labels"] = {
        **labels,
        L.TEMPLATE_HASH: template_hash(template),
        L.REVISION: revision,
    }
    return template
