"""All serving children of one LLMDeployment: spec + plan (+ engine state) -> objects to apply.

Shared objects (Services, autoscaler) exist once per deployment; per-slot objects (model
repository, workloads, PDB of each pool) once per slot, so a canary renders two slots and one set
of shared objects.

Pure: no I/O, deterministic order, so `llm-operator render` and golden files show exactly what the
operator applies. The owner reference is added here too, so a rendered object is the applied one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llm_operator import labels as L
from llm_operator.api.v1alpha1 import API_VERSION, KIND, Backend, LLMDeployment, RoutingMode
from llm_operator.images import Images
from llm_operator.modelrepo import render_repository, to_configmap_data
from llm_operator.plan.types import Plan, PoolPlan
from llm_operator.render import autoscaling, names, network, policy, services
from llm_operator.render.pod import template_hash
from llm_operator.render.router import objects as routing
from llm_operator.render.router.limits import replica_capacity
from llm_operator.render.router.waker import waking
from llm_operator.render.serving import workloads
from llm_operator.rollout.revision import Slot
from llm_operator.storage import EngineLocation, ModelLocation, tokenizer_dir, tokenizer_location


@dataclass(frozen=True)
class PoolEngine:
    """The engine a pool serves: where it is, and whether it exists yet."""

    location: EngineLocation | None  # None: the backend needs no engine files (pytorch, cpu-reference)
    cache_key: str | None
    ready: bool


def owner_reference(ld: LLMDeployment) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": ld.name,
        "uid": ld.metadata.get("uid", ""),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def model_repo_configmap(
    ld: LLMDeployment,
    pool: PoolPlan,
    engine: PoolEngine,
    slot: Slot = Slot.A,
    model: ModelLocation | None = None,
) -> tuple[dict[str, Any], str]:
    """The ConfigMap and the hash of its content, which names it (the pods mount it by that name)."""
    engine_dir = engine.location.engine_dir if engine.location else ""
    tokenizer = tokenizer_dir(tokenizer_location(ld.spec.runtime.tokenizer_uri), engine.location, model)
    model_dir = model.model_dir if model else ""
    files = render_repository(
        ld.spec, pool, engine_dir=engine_dir, tokenizer_dir=tokenizer, model_dir=model_dir
    )
    data = to_configmap_data(files)
    content_hash = template_hash(data)
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": names.model_repo(ld.name, pool, content_hash, slot),
            "namespace": ld.namespace,
            "labels": L.slot_labels(ld.name, "model-repository", pool.name, slot),
        },
        # Named by its content and never changed: it needs no ordering against the workloads that
        # mount it (applied together), and kubelets need not watch it.
        "immutable": True,
        "data": data,
    }
    return configmap, content_hash


def serving_pool(
    ld: LLMDeployment,
    pool: PoolPlan,
    images: Images,
    engine: PoolEngine,
    *,
    slot: Slot,
    revision: str,
    leader_worker_set: bool,
    model: ModelLocation | None = None,
) -> list[dict[str, Any]]:
    """ConfigMap, workload(s) and PDB of one pool in one slot."""
    repo, repo_hash = model_repo_configmap(ld, pool, engine, slot, model)
    objs = [repo]
    objs += workloads(
        ld.name,
        ld.namespace,
        ld.spec,
        pool,
        images,
        engine.location,
        repo_hash,
        uid=ld.metadata.get("uid", ""),
        slot=slot,
        revision=revision,
        leader_worker_set=leader_worker_set,
        model=model,
    )
    objs.append(policy.disruption_budget(ld.name, ld.namespace, pool, slot))
    return objs


def shared_children(
    ld: LLMDeployment,
    images: Images,
    *,
    prometheus_url: str = autoscaling.DEFAULT_PROMETHEUS_URL,
    metrics_peers: Sequence[str] = network.DEFAULT_METRICS_PEERS,
    keep_any_source: bool = False,
    canary: bool = False,
    keda_namespace: str = network.DEFAULT_KEDA_NAMESPACE,
    running_hold: int | None = None,
) -> list[dict[str, Any]]:
    """Once per deployment, whatever its slots: the client Service (leaders of both slots, so the
    replica ratio is the traffic split), the headless Service, the autoscaler (of the total), the
    NetworkPolicy (of every serving pod), and in routing.mode inference-pool the InferencePool
    (leaders of both slots) and its router. `keep_any_source`: the applied policy admits clients
    from any source (render/network.py, upgrades). `canary`: a canary rollout is under way (an
    autoscaler at minReplicas 0 then keeps a replica). `keda_namespace`: where KEDA's operator runs,
    the one client of the router's waker at minReplicas 0. `running_hold`: the derived hold the
    applied router ConfigMap records (render/scale_to_zero.py running_hold)."""
    objs: list[dict[str, Any]] = [
        services.client_service(ld.name, ld.namespace),
        services.headless_service(ld.name, ld.namespace),
    ]
    if ld.spec.autoscaling is not None:
        objs.append(autoscaling.autoscaler(ld.name, ld.namespace, ld.spec.autoscaling, prometheus_url,
                                           capacity=replica_capacity(ld.spec), canary=canary))  # fmt: skip
    pool = ld.spec.routing.mode == RoutingMode.INFERENCE_POOL
    if ld.spec.network_policy.enabled:
        policy_spec = ld.spec.network_policy
        objs.append(network.network_policy(ld.name, ld.namespace, policy_spec, metrics_peers, router=pool,
                                           triton_closed=network.triton_closed(ld),
                                           keep_any_source=keep_any_source))  # fmt: skip
        if pool:
            gateways = ld.spec.routing.picker.gateway_namespace_selector if ld.spec.routing.picker else None
            objs.append(network.router_network_policy(
                ld.name, ld.namespace, policy_spec, metrics_peers, gateways, keep_any_source=keep_any_source,
                keda_namespace=keda_namespace if waking(ld) else None,
            ))  # fmt: skip
    objs += routing.routing_children(ld, images, running_hold)
    return owned(ld, objs)


def slot_children(
    ld: LLMDeployment,
    plan: Plan,
    images: Images,
    engines: dict[str, PoolEngine],
    *,
    slot: Slot = Slot.A,
    revision: str,
    leader_worker_set: bool = False,
    model: ModelLocation | None = None,
) -> list[dict[str, Any]]:
    """The serving objects of one slot, running `revision` of `ld.spec` at the plan's replica
    counts. A pool whose engine is not ready contributes nothing, so whatever it served before
    (the previous revision) stays untouched until the new engine exists. `model`: where the pods
    read the model's files (a cached or pvc:// source), mounted read-only."""
    objs: list[dict[str, Any]] = []
    for pool in plan.pools:
        engine = engines[pool.name]
        if engine.ready:
            objs += serving_pool(
                ld, pool, images, engine, slot=slot, revision=revision,
                leader_worker_set=leader_worker_set, model=model,
            )  # fmt: skip
    return owned(ld, objs)


def owned(ld: LLMDeployment, objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The objects, controlled by the deployment (the garbage collector removes them with it)."""
    owner = owner_reference(ld)
    for obj in objs:
        obj["metadata"]["ownerReferences"] = [owner]
    return objs


def needs_engine(ld: LLMDeployment) -> bool:
    """Only the tensorrt-engine backend serves engines (built by a Job, or prebuilt)."""
    return ld.spec.engine.backend == Backend.TENSORRT_ENGINE


def serving_selector(deployment: str) -> str:
    """status.selector: the pods the HPA averages metrics over (leaders serve and export them)."""
    return ",".join(f"{k}={v}" for k, v in {**L.selector_labels(deployment), L.ROLE: "leader"}.items())
