"""Serving pods: the Triton StatefulSet(s) of one GPU pool.

A replica is one pod when tp*pp GPUs fit one node (one StatefulSet, one pod per replica), or a
group of pods_per_replica pods otherwise (one StatefulSet per group, pod 0 the leader), so a
failed group can be recreated as a whole without touching the others.
"""

from __future__ import annotations

from typing import Any

from llm_operator import contract
from llm_operator import labels as L
from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.images import Images
from llm_operator.plan.types import PoolPlan
from llm_operator.render import names
from llm_operator.render.pod import pod_template
from llm_operator.rollout.revision import Slot
from llm_operator.storage import EngineLocation, ModelLocation

POD_INDEX = "apps.kubernetes.io/pod-index"  # set by the StatefulSet controller (k8s >= 1.28)
LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"  # on every pod of one group, set by LWS


def _label_env(name: str, label: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{label}']"}}}


def _admin_key_env(deployment: str, uid: str) -> dict[str, Any]:
    """The leader's key of Triton's admin APIs (controller/secrets/admin_key.py makes the Secret); workers
    serve no HTTP or gRPC."""
    secret = names.admin_key_secret(deployment, uid)
    ref = {"name": secret, "key": contract.ADMIN_KEY_SECRET_KEY}
    return {"name": contract.ADMIN_KEY_ENV, "valueFrom": {"secretKeyRef": ref}}


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
    model: ModelLocation | None = None,
) -> list[dict[str, Any]]:
    """The workload objects serving `pool.replicas` replicas of this pool.

    Single-pod replicas: one StatefulSet. Multi-node replicas: a LeaderWorkerSet when its CRD is
    installed (it recreates a group as a whole), else the same shape built from StatefulSets: one
    leader StatefulSet whose pod i is rank 0 of group i (probes, Services, metrics) and one worker
    StatefulSet per group, its ordinals starting at 1 like LWS worker indexes, kept next to the
    leader by pod affinity. The launcher reads the same environment in both shapes. `uid`, the
    LLMDeployment's, names the launch Secret multi-node pods mount (controller/secrets/launch.py
    creates it) and the admin-key Secret of every leader (controller/secrets/admin_key.py).
    Every object and selector carries the slot, so the two slots of a canary never share pods;
    `revision` (the deployment's) is a label of the objects and their pods, in no selector.
    """
    launch_secret = names.launch_secret(deployment, uid)
    admin_key = _admin_key_env(deployment, uid)
    if pool.pods_per_replica > 1 and leader_worker_set:
        return [
            _leader_worker_set(
                deployment, namespace, spec, pool, images, engine, repo_hash, launch_secret, admin_key, slot,
                revision, model,
            )
        ]  # fmt: skip
    base = L.slot_labels(deployment, "serving", pool.name, slot)
    headless = names.headless_service(deployment)
    leader_name = names.serving(deployment, pool, slot)
    multi = pool.pods_per_replica > 1
    leader_env: list[dict[str, Any]] = [admin_key]
    if multi:
        prefix = names.group_prefix(deployment, pool, slot)
        pattern = f"{prefix}{{group}}-{{worker}}.{headless}.{namespace}.svc"
        leader_env += [
            {"name": "LLMOP_ROLE", "value": "leader"},
            _label_env("LLMOP_GROUP_INDEX", POD_INDEX),
            {"name": "LLMOP_WORKER_HOST_PATTERN", "value": pattern},
            stall_env(spec),
        ]
    leader_labels = {**base, L.ROLE: "leader"}
    template = pod_template(
        spec, pool, deployment, images, engine,
        pod_labels=_group_labels(leader_labels, pool), group_selector=None, leader=True,
        extra_env=leader_env, repo_hash=repo_hash, launch_secret=launch_secret, slot=slot, revision=revision,
        model=model,
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
        template = pod_template(
            spec, pool, deployment, images, engine,
            pod_labels=_group_labels(worker_labels, pool), group_selector=leader_selector, leader=False,
            extra_env=extra_env, repo_hash=repo_hash, launch_secret=launch_secret, slot=slot,
            revision=revision, model=model,
        )  # fmt: skip
        sts = _statefulset(
            names.group(deployment, pool, index, slot), namespace, worker_labels,
            pool.pods_per_replica - 1, template, deployment, revision,
        )  # fmt: skip
        sts["spec"]["ordinals"] = {"start": 1}
        result.append(sts)
    return result


def stall_env(spec: LLMDeploymentSpec) -> dict[str, str]:
    """A group's leader watches its world for a stall (frontdoor/stall.py): a frozen member leaves
    Triton on the leader live, so no probe would see it."""
    return {"name": "LLMOP_STALL_TIMEOUT_SECONDS", "value": str(spec.runtime.stall_timeout_seconds)}


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
    launch_secret: str,
    admin_key: dict[str, Any],
    slot: Slot,
    revision: str,
    model: ModelLocation | None,
) -> dict[str, Any]:
    name = names.leader_worker_set(deployment, pool, slot)
    base = L.slot_labels(deployment, "serving", pool.name, slot)
    # LWS names pods <name>-<group> (leader) and <name>-<group>-<worker>, their subdomain the headless
    # Service it creates, <name> (no networkConfig: the Shared subdomain policy of every release),
    # and injects LWS_LEADER_ADDRESS into every container.
    pattern = f"{name}-{{group}}-{{worker}}.{name}.{namespace}.svc"
    # Narrowed to one group by its group-key.
    group = {L.DEPLOYMENT: deployment, L.POOL: pool.name, L.SLOT: slot.value}
    leader = pod_template(
        spec, pool, deployment, images, engine,
        pod_labels=_group_labels({**base, L.ROLE: "leader"}, pool), leader=True,
        group_selector=group, group_label_keys=(LWS_GROUP_KEY,),
        extra_env=[
            admin_key,
            {"name": "LLMOP_ROLE", "value": "leader"},
            _label_env("LLMOP_GROUP_INDEX", LWS_GROUP_INDEX),
            {"name": "LLMOP_WORKER_HOST_PATTERN", "value": pattern},
            stall_env(spec),
        ],
        repo_hash=repo_hash, launch_secret=launch_secret, slot=slot, revision=revision, model=model,
    )  # fmt: skip
    worker = pod_template(
        spec, pool, deployment, images, engine,
        pod_labels=_group_labels({**base, L.ROLE: "worker"}, pool), leader=False,
        group_selector=group, group_label_keys=(LWS_GROUP_KEY,),
        extra_env=[
            {"name": "LLMOP_ROLE", "value": "worker"},
            _label_env("LLMOP_GROUP_INDEX", LWS_GROUP_INDEX),
        ],
        repo_hash=repo_hash, launch_secret=launch_secret, slot=slot, revision=revision, model=model,
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
