"""Serving pods: the Triton StatefulSet(s) of one GPU pool.

A replica is one pod when tp*pp GPUs fit one node (one StatefulSet, one pod per replica), or a
group of pods_per_replica pods otherwise (one StatefulSet per group, pod 0 the leader), so a
failed group can be recreated as a whole without touching the others.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from llm_operator import contract
from llm_operator import labels as L
from llm_operator.api.v1alpha1 import Backend, LLMDeploymentSpec
from llm_operator.images import Images
from llm_operator.plan.types import PoolPlan
from llm_operator.render import names
from llm_operator.render.placement import pod_scheduling
from llm_operator.rollout.revision import Slot
from llm_operator.storage import EngineLocation


def template_hash(obj: Any) -> str:
    """Short stable hash: pods roll when (and only when) what they run changes."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:10]


def _env(spec: LLMDeploymentSpec, pool: PoolPlan, engine: EngineLocation | None) -> list[dict[str, Any]]:
    """What every serving container gets (contract.ENV); multi-node pods add their role and group
    addressing (workloads)."""
    env: list[dict[str, Any]] = [
        {"name": contract.POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "LLMOP_BACKEND", "value": spec.engine.backend.value},
        {"name": "LLMOP_TP", "value": str(pool.tensor)},
        {"name": "LLMOP_PP", "value": str(pool.pipeline)},
        {"name": "LLMOP_GPUS_PER_POD", "value": str(pool.gpus_per_pod)},
        {"name": "LLMOP_PODS_PER_REPLICA", "value": str(pool.pods_per_replica)},
        {"name": "LLMOP_MODEL_REPO_SRC", "value": contract.MODEL_REPO_SRC},
        {"name": "LLMOP_MODEL_REPO", "value": contract.MODEL_REPO},
        {"name": "LLMOP_HTTP_PORT", "value": str(contract.HTTP_PORT)},
        {"name": "LLMOP_GRPC_PORT", "value": str(contract.GRPC_PORT)},
        {"name": "LLMOP_METRICS_PORT", "value": str(contract.METRICS_PORT)},
        {"name": "LLMOP_EXIT_TIMEOUT_SECONDS", "value": str(spec.runtime.exit_timeout_seconds)},
    ]
    if engine is not None:
        env.append({"name": "LLMOP_ENGINE_DIR", "value": engine.engine_dir})
    return env


def _container(
    spec: LLMDeploymentSpec,
    pool: PoolPlan,
    images: Images,
    engine: EngineLocation | None,
    *,
    leader: bool,
    extra_env: list[dict[str, Any]],
) -> dict[str, Any]:
    cpu = spec.engine.backend == Backend.CPU_REFERENCE
    resources: dict[str, Any] = {}
    requests: dict[str, str] = {}
    if spec.resources.cpu:
        requests["cpu"] = spec.resources.cpu
    if spec.resources.memory:
        requests["memory"] = spec.resources.memory
    limits: dict[str, str] = {}
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
    ]
    if engine is not None:
        mounts.append({"name": "engine-cache", "mountPath": contract.ENGINE_CACHE_MOUNT, "readOnly": True})
    if pool.pods_per_replica > 1:
        mounts.append({"name": contract.SSH_VOLUME, "mountPath": contract.SSH_DIR, "readOnly": True})
    user_env, user_env_from = spec.runtime.container_env()
    container: dict[str, Any] = {
        "name": "triton",
        "image": spec.runtime.image or (images.cpu_runtime if cpu else images.runtime),
        "command": list(contract.CONTAINER_COMMAND),
        "env": _env(spec, pool, engine) + extra_env + user_env,
        "ports": [
            {"name": "http", "containerPort": contract.HTTP_PORT},
            {"name": "grpc", "containerPort": contract.GRPC_PORT},
            {"name": "metrics", "containerPort": contract.METRICS_PORT},
        ],
        "volumeMounts": mounts,
        # A runtime that dies before writing a termination message leaves the tail of its log
        # there instead: the operator quotes it in status (kubectl logs is not needed to see why).
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if user_env_from:
        container["envFrom"] = user_env_from
    if resources:
        container["resources"] = resources
    if leader:
        # Only rank 0 serves: probes belong to the leader.
        health = {"path": "/v2/health/ready", "port": "http"}
        container["startupProbe"] = {
            "httpGet": health,
            "periodSeconds": 10,
            "failureThreshold": max(1, spec.runtime.startup_timeout_seconds // 10),
        }
        container["readinessProbe"] = {"httpGet": dict(health), "periodSeconds": 5, "failureThreshold": 2}
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
    ssh_secret: str,
    slot: Slot,
) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [
        {"name": "model-repo-src", "configMap": {"name": names.model_repo(deployment, pool, slot)}},
        {"name": "model-repo", "emptyDir": {}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.resources.shm_size}},
        {"name": "tmp", "emptyDir": {}},
    ]
    if engine is not None:
        volumes.append(
            {
                "name": "engine-cache",
                "persistentVolumeClaim": {"claimName": engine.claim, "readOnly": True},
            }
        )
    if pool.pods_per_replica > 1:
        # The deployment's SSH identity (the controller creates the Secret): the leader's mpirun
        # logs in to its workers' sshd with it.
        volumes.append({"name": contract.SSH_VOLUME, "secret": {"secretName": ssh_secret}})
    return volumes


def _pod_template(
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
    ssh_secret: str,
    slot: Slot,
    revision: str,
    group_label_keys: tuple[str, ...] = (),
) -> dict[str, Any]:
    # Leaders spread over the whole pool, both slots: they are one deployment's replicas.
    selector = {**L.selector_labels(deployment), L.POOL: pool.name}
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": contract.termination_grace_seconds(
            spec.runtime.exit_timeout_seconds
        ),
        # Restricted Pod Security: the images name a numeric non-root USER, which the kubelet
        # checks against runAsNonRoot; workers' sshd runs unprivileged (runtime/ssh.py).
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [_container(spec, pool, images, engine, leader=leader, extra_env=extra_env)],
        "volumes": _volumes(spec, pool, deployment, engine, ssh_secret, slot),
        **spec.runtime.pod_identity(),
    }
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
    # The user's labels and annotations first: the operator's own keys always win (admission
    # refuses the reserved prefixes anyway).
    labels = {**spec.runtime.pod_labels, **pod_labels}
    template: dict[str, Any] = {
        "metadata": {
            "labels": labels,
            "annotations": {**spec.runtime.pod_annotations, f"{L.DEPLOYMENT}-model-repo-hash": repo_hash},
        },
        "spec": pod_spec,
    }
    # The revision says what the pod serves (routing, analysis, metrics); the template hash, taken
    # before both labels are added, is what rolls the pods (it also covers the plan's placement).
    template["metadata"]["labels"] = {
        **labels,
        L.TEMPLATE_HASH: template_hash(template),
        L.REVISION: revision,
    }
    return template


POD_INDEX = "apps.kubernetes.io/pod-index"  # set by the StatefulSet controller (k8s >= 1.28)
LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"  # on every pod of one group, set by LWS


def _label_env(name: str, label: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{label}']"}}}


def workloads(
    deployment: str,
    namespace: str,
    spec: LLMDeploymentSpec,
    pool: PoolPlan,
    images: Images,
    engine: EngineLocation | None,
    repo_hash: str,
    *,
    uid: str,
    slot: Slot = Slot.A,
    revision: str,
    leader_worker_set: bool = False,
) -> list[dict[str, Any]]:
    """The workload objects serving `pool.replicas` replicas of this pool.

    Single-pod replicas: one StatefulSet. Multi-node replicas: a LeaderWorkerSet when its CRD is
    installed (it recreates a group as a whole), else the same shape built from StatefulSets: one
    leader StatefulSet whose pod i is rank 0 of group i (probes, Services, metrics) and one worker
    StatefulSet per group, its ordinals starting at 1 like LWS worker indexes, kept next to the
    leader by pod affinity. The launcher reads the same environment in both shapes. `uid`, the
    LLMDeployment's, names the SSH Secret multi-node pods mount (controller/ssh.py creates it).
    Every object and selector carries the slot, so the two slots of a canary never share pods;
    `revision` (the deployment's) is a label of the objects and their pods, in no selector.
    """
    ssh_secret = names.ssh_secret(deployment, uid)
    if pool.pods_per_replica > 1 and leader_worker_set:
        return [
            _leader_worker_set(
                deployment, namespace, spec, pool, images, engine, repo_hash, ssh_secret, slot, revision
            )
        ]
    base = L.slot_labels(deployment, "serving", pool.name, slot)
    headless = names.headless_service(deployment)
    leader_name = names.serving(deployment, pool, slot)
    multi = pool.pods_per_replica > 1
    leader_env: list[dict[str, Any]] = []
    if multi:
        prefix = names.group_prefix(deployment, pool, slot)
        pattern = f"{prefix}{{group}}-{{worker}}.{headless}.{namespace}.svc"
        leader_env = [
            {"name": "LLMOP_ROLE", "value": "leader"},
            _label_env("LLMOP_GROUP_INDEX", POD_INDEX),
            {"name": "LLMOP_WORKER_HOST_PATTERN", "value": pattern},
        ]
    leader_labels = {**base, L.ROLE: "leader"}
    template = _pod_template(
        spec, pool, deployment, images, engine,
        pod_labels=_group_labels(leader_labels, pool), group_selector=None, leader=True,
        extra_env=leader_env, repo_hash=repo_hash, ssh_secret=ssh_secret, slot=slot, revision=revision,
    )  # fmt: skip
    result = [
        _statefulset(leader_name, namespace, leader_labels, pool.replicas, template, deployment, revision)
    ]
    for index in range(pool.replicas if multi else 0):
        worker_labels = {**base, L.ROLE: "worker", L.GROUP_INDEX: str(index)}
        leader_selector = {
            **L.selector_labels(deployment), L.POOL: pool.name, L.SLOT: slot.value, L.ROLE: "leader",
            POD_INDEX: str(index),
        }  # fmt: skip
        extra_env = [
            {"name": "LLMOP_ROLE", "value": "worker"},
            {"name": "LLMOP_GROUP_INDEX", "value": str(index)},
            {"name": "LLMOP_LEADER_HOST", "value": f"{leader_name}-{index}.{headless}.{namespace}.svc"},
        ]
        template = _pod_template(
            spec, pool, deployment, images, engine,
            pod_labels=_group_labels(worker_labels, pool), group_selector=leader_selector, leader=False,
            extra_env=extra_env, repo_hash=repo_hash, ssh_secret=ssh_secret, slot=slot, revision=revision,
        )  # fmt: skip
        sts = _statefulset(
            names.group(deployment, pool, index, slot), namespace, worker_labels,
            pool.pods_per_replica - 1, template, deployment, revision,
        )  # fmt: skip
        sts["spec"]["ordinals"] = {"start": 1}
        result.append(sts)
    return result


def _group_labels(labels: dict[str, str], pool: PoolPlan) -> dict[str, str]:
    """Pods of multi-node replicas carry the group size, so the controller can tell a broken group."""
    return {**labels, L.GROUP_SIZE: str(pool.pods_per_replica)} if pool.pods_per_replica > 1 else labels


def _leader_worker_set(
    deployment: str,
    namespace: str,
    spec: LLMDeploymentSpec,
    pool: PoolPlan,
    images: Images,
    engine: EngineLocation | None,
    repo_hash: str,
    ssh_secret: str,
    slot: Slot,
    revision: str,
) -> dict[str, Any]:
    name = names.serving(deployment, pool, slot)
    base = L.slot_labels(deployment, "serving", pool.name, slot)
    # LWS names pods <name>-<group> (leader) and <name>-<group>-<worker> under a headless Service
    # called <name>, and injects LWS_LEADER_ADDRESS into every container.
    pattern = f"{name}-{{group}}-{{worker}}.{name}.{namespace}.svc"
    # Narrowed to one group by its group-key.
    group = {L.DEPLOYMENT: deployment, L.POOL: pool.name, L.SLOT: slot.value}
    leader = _pod_template(
        spec, pool, deployment, images, engine,
        pod_labels=_group_labels({**base, L.ROLE: "leader"}, pool), leader=True,
        group_selector=group, group_label_keys=(LWS_GROUP_KEY,),
        extra_env=[
            {"name": "LLMOP_ROLE", "value": "leader"},
            _label_env("LLMOP_GROUP_INDEX", LWS_GROUP_INDEX),
            {"name": "LLMOP_WORKER_HOST_PATTERN", "value": pattern},
        ],
        repo_hash=repo_hash, ssh_secret=ssh_secret, slot=slot, revision=revision,
    )  # fmt: skip
    worker = _pod_template(
        spec, pool, deployment, images, engine,
        pod_labels=_group_labels({**base, L.ROLE: "worker"}, pool), leader=False,
        group_selector=group, group_label_keys=(LWS_GROUP_KEY,),
        extra_env=[
            {"name": "LLMOP_ROLE", "value": "worker"},
            _label_env("LLMOP_GROUP_INDEX", LWS_GROUP_INDEX),
        ],
        repo_hash=repo_hash, ssh_secret=ssh_secret, slot=slot, revision=revision,
    )  # fmt: skip
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "namespace": namespace, "labels": {**base, L.REVISION: revision}},
        "spec": {
            "replicas": pool.replicas,
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0},
            },
            "leaderWorkerTemplate": {
                "size": pool.pods_per_replica,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader,
                "workerTemplate": worker,
            },
        },
    }


def _statefulset(
    name: str,
    namespace: str,
    labels: dict[str, str],
    replicas: int,
    template: dict[str, Any],
    deployment: str,
    revision: str,
) -> dict[str, Any]:
    # A selector is immutable: the revision (which changes) is never in it.
    keys = (L.DEPLOYMENT, L.POOL, L.SLOT, L.ROLE, L.GROUP_INDEX)
    selector = {k: v for k, v in labels.items() if k in keys}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": namespace, "labels": {**labels, L.REVISION: revision}},
        "spec": {
            "replicas": replicas,
            "serviceName": names.headless_service(deployment),
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "RollingUpdate"},
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Delete"},
            "selector": {"matchLabels": selector},
            "template": template,
        },
    }
