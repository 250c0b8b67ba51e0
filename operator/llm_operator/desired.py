"""What the operator wants to exist for one LLMDeployment: plan -> engines -> children.

Pure: the reconciler calls `desired` with what the cluster shows about the model cache and engine
builds, and `llm-operator render` calls the same function, so the golden files pin what is
applied. Writes (fetch and build Jobs, index entries, serving objects) are only listed here; the
reconciler's apply step performs them. An s3:// or hf:// model is fetched first: until it is in
the cache no engine is built and every pool is held, so a new revision never stops the old one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from llm_operator import releases
from llm_operator.api.v1alpha1 import PVC_URI, STORAGE_URI_MESSAGE, Backend, LLMDeployment, LLMDeploymentSpec
from llm_operator.engine import build_job, cache_key
from llm_operator.engine.sizing import ClaimNeed, build_size
from llm_operator.engine.state import (
    BuildFact,
    BuildObserved,
    EngineState,
    ModelFact,
    ModelObserved,
    ModelState,
    ModelStatus,
    PoolEngineStatus,
)
from llm_operator.images import Images
from llm_operator.plan.cpu import cpu_plan
from llm_operator.plan.floor import plan_within_floor
from llm_operator.plan.inventory import Inventory
from llm_operator.plan.types import Plan, PlanningError, PoolPlan
from llm_operator.render import names
from llm_operator.render.autoscaling import DEFAULT_PROMETHEUS_URL
from llm_operator.render.children import (
    PoolEngine,
    needs_engine,
    owner_reference,
    shared_children,
    slot_children,
)
from llm_operator.render.model_fetch import fetch_job, model_request
from llm_operator.render.network import DEFAULT_KEDA_NAMESPACE, DEFAULT_METRICS_PEERS
from llm_operator.rollout.revision import Slot, revision_of
from llm_operator.storage import ModelLocation, cached_model, checkpoint_location, engine_location

# (namespace, cache key, build Job name) -> what the cluster shows about that build.
BuildLookup = Callable[[str, str, str], BuildObserved]
# (namespace, fetch key, fetch Job name) -> what the cluster shows about that model.
ModelLookup = Callable[[str, str, str], ModelObserved]
MODEL_READY = (ModelState.READY, ModelState.NOT_CACHED)


@dataclass(frozen=True)
class Desired:
    """One slot of a deployment, and the objects the deployment shares whatever its slots."""

    plan: Plan
    jobs: list[dict[str, Any]]  # engine builds to start (or keep), applied before the children
    children: list[dict[str, Any]]  # the slot's objects; pools whose engine is missing give none
    shared: list[dict[str, Any]]  # Services, autoscaler: apply those of one render only
    engines: dict[str, PoolEngineStatus]  # per pool
    record: tuple[str, ...]  # cache keys whose build succeeded: add them to the engine index
    slot: Slot
    revision: str  # the pod templates' revision label
    claim_needs: tuple[ClaimNeed, ...] = ()  # what the builds to start need on the claims they write
    model: ModelStatus = field(default_factory=lambda: ModelStatus(ModelState.NOT_CACHED))
    # fetch key -> index value of a fetch whose Job succeeded: add it to the model cache index
    model_record: dict[str, str] = field(default_factory=dict)

    @property
    def held(self) -> frozenset[tuple[str, str]]:
        """(slot, pool) of pools waiting for their model or engine: what they served before is
        kept, not pruned."""
        usable = (EngineState.READY, EngineState.NOT_NEEDED)
        waiting = self.model.state not in MODEL_READY
        return frozenset(
            (self.slot.value, n) for n, e in self.engines.items() if waiting or e.state not in usable
        )


def plan_for(ld: LLMDeployment, inventory: Inventory | None, images: Images | None = None) -> Plan:
    """Raises PlanningError when the spec cannot be placed. `images`: the operator's, whose
    release sets the CUDA driver floor of GPU nodes (plan/floor.py); None plans without one."""
    if ld.spec.engine.backend == Backend.CPU_REFERENCE:
        return cpu_plan(ld.spec)
    if ld.spec.engine.backend == Backend.TENSORRT_ENGINE:
        _check_engine_storage(ld.spec)
    release = serving_release(ld, images) if images is not None else None
    plan = plan_within_floor(ld.spec, inventory, ld.spec.replicas, release)
    across = [p for p in plan.pools if p.pods_per_replica > 1 and p.tensor > p.gpus_per_pod]
    if ld.spec.engine.backend == Backend.PYTORCH and across:
        # A replica spanning pods runs under trtllm-llmapi-launch (runtime/commands.py), whose
        # Triton docs at TensorRT-LLM 1.1.0 say "inter-node tensor parallelism is not yet
        # supported" (tensorrtllm_backend r25.12 docs/llmapi.md; later copies drop the sentence
        # without saying it is).
        p = across[0]
        raise PlanningError(
            "PyTorchTensorParallelAcrossPods",
            f"engine.backend pytorch spans pods by pipeline stages only, and tensor parallel "
            f"{p.tensor} needs more GPUs than the {p.gpus_per_pod} of one pod (Triton's llmapi model "
            "does not support tensor parallelism across nodes): lower parallelism.tensor to what one "
            "node holds and raise parallelism.pipeline, or with parallelism auto set "
            "placement.tensorParallelDomain node, or use engine.backend tensorrt-engine",
        )
    return plan


def serving_release(ld: LLMDeployment, images: Images) -> releases.Release | None:
    """The release of the TensorRT-LLM the pods run (engine.build.tensorrtLlmVersion, else the
    operator's images'), whose CUDA needs its driver; None for a version the table lacks. Custom
    images of a known version are held to its release: its wheels carry that CUDA."""
    build = ld.spec.engine.build
    return releases.for_trtllm((build and build.tensorrt_llm_version) or images.trtllm_version)


def _check_engine_storage(spec: LLMDeploymentSpec) -> None:
    """The first CRD took s3:// and gs:// engine caches: one stored then is refused by name here
    (admission refuses it now) rather than failing every reconcile where pods mount the cache."""
    prebuilt = spec.engine.prebuilt
    for name, uri in (
        ("engine.prebuilt.uri", prebuilt.uri if prebuilt else None),
        ("engine.cache.uri", spec.engine.cache.uri),
    ):
        if uri is not None and not re.match(PVC_URI, uri):
            raise PlanningError("EngineStorageNotOnClaim", f"{name} {STORAGE_URI_MESSAGE}")


def check_release(ld: LLMDeployment, images: Images) -> None:
    """Raises PlanningError when the release the spec's backend runs on cannot serve it: the
    serving image's for pytorch, the engines' TensorRT-LLM (tensorrtLlmVersion, else the serving
    image's) for tensorrt-engine."""
    build = ld.spec.engine.build
    version = images.trtllm_version
    if ld.spec.engine.backend == Backend.TENSORRT_ENGINE and build and build.tensorrt_llm_version:
        version = build.tensorrt_llm_version
    check_backend(ld.spec.engine.backend, version, releases.for_trtllm(version))


def check_backend(backend: Backend, version: str, release: releases.Release | None) -> None:
    """Raises PlanningError when `release` (TensorRT-LLM `version`'s row; None: not in the table)
    lacks `backend`. Engines of a version outside the table run on images the spec names, which
    the operator cannot judge; pytorch needs the llmapi model where the table's images keep it."""
    if backend == Backend.PYTORCH and (release is None or not release.has_pytorch_backend):
        having = ", ".join(r.trtllm for r in releases.RELEASES if r.has_pytorch_backend)
        raise PlanningError(
            "BackendNotInRelease",
            f"engine.backend pytorch needs a release that ships Triton's llmapi model, and the "
            f"operator's serving image runs TensorRT-LLM {version}, "
            f"{'which is not in its release table' if release is None else 'which has none'}: use "
            f"engine.backend tensorrt-engine, or run the operator with a release that has it "
            f"(TensorRT-LLM {having})",
        )
    if backend == Backend.TENSORRT_ENGINE and release is not None and not release.has_tensorrt_engine_backend:
        last = releases.last_with_tensorrt_engine()
        raise PlanningError(
            "BackendNotInRelease",
            f"engine.backend tensorrt-engine (trtllm-build engines) is not in TensorRT-LLM {version}: "
            f"upstream removed the TensorRT backend after v1.3.0rc20, and the newest release the "
            f"operator knows with it is TensorRT-LLM {last.trtllm}: use engine.backend pytorch, or set "
            f"runtime.image and engine.build.image to {last.image} and "
            f"engine.build.tensorrtLlmVersion to {last.trtllm}",
        )


def trtllm_version(ld: LLMDeployment, images: Images) -> str:
    """The TensorRT-LLM version engines are built with; raises PlanningError when the serving
    image would run another one (an engine only loads in the version that built it)."""
    build = ld.spec.engine.build
    if build is None or not build.tensorrt_llm_version:
        return images.trtllm_version
    wanted = build.tensorrt_llm_version
    defaults = [what for what, custom in (("runtime", ld.spec.runtime.image), ("builder", build.image))
                if not custom]  # fmt: skip
    if defaults and releases.for_trtllm(wanted) is None:
        known = releases.known_versions()
        raise PlanningError(
            "TensorRtLlmVersionUnknown",
            f"engine.build.tensorrtLlmVersion is not a TensorRT-LLM version of a release the "
            f"operator knows ({known}): use one of those, or set runtime.image and "
            f"engine.build.image to images of your version",
        )
    if wanted != images.trtllm_version and defaults:
        raise PlanningError(
            "TensorRtLlmVersionMismatch",
            f"engine.build.tensorrtLlmVersion is {wanted}, but the default "
            f"{' and '.join(defaults)} image{'s' if len(defaults) > 1 else ''} run TensorRT-LLM "
            f"{images.trtllm_version}, the deployment's release (status.release): set runtime.image "
            f"and engine.build.image to images of {wanted}, or remove tensorrtLlmVersion",
        )
    return wanted


def builder_image(ld: LLMDeployment, images: Images, version: str) -> str:
    """engine.build.image, else the operator's configured builder (a mirror), else NVIDIA's
    tritonserver trtllm image of the release that carries TensorRT-LLM `version`, unchanged."""
    custom = (ld.spec.engine.build and ld.spec.engine.build.image) or images.engine_builder
    if custom:
        return custom
    release = releases.for_trtllm(version)
    if release is None:
        known = releases.known_versions()
        raise PlanningError(
            "BuilderImageUnknown",
            f"no NVIDIA image of TensorRT-LLM {version} is known to the operator (it knows {known}): "
            "set engine.build.image to an image of that version",
        )
    return release.image


def desired(  # raises PlanningError for a spec the images cannot serve
    ld: LLMDeployment,
    plan: Plan,
    images: Images,
    builds: BuildLookup,
    *,
    slot: Slot = Slot.A,
    revision: str | None = None,
    leader_worker_set: bool = False,
    prometheus_url: str = DEFAULT_PROMETHEUS_URL,
    metrics_peers: Sequence[str] = DEFAULT_METRICS_PEERS,
    keda_namespace: str = DEFAULT_KEDA_NAMESPACE,
    models: ModelLookup | None = None,
    fetch_max_bytes_per_second: int | None = None,
    keep_any_source: bool = False,
    deployment: LLMDeployment | None = None,
    canary: bool = False,
    running_hold: int | None = None,
) -> Desired:
    """`ld` rendered into `slot` at the plan's replica counts. `revision` labels its pods; None:
    `revision_of(ld.spec, images)`. A stable slot rendered from its snapshot passes the revision
    it was started under (the operator's images may have changed since). `models`: None, no
    model is cached yet. `keep_any_source`: the applied NetworkPolicy admits clients from any
    source (render/network.py, upgrades). `deployment`: the whole deployment when `ld` is a slot's
    share of it (render/rollout.py for_slot), which the shared children are rendered from: the
    router's limits follow spec.replicas, and a canary step's split of them must not restart it.
    `canary`: a canary rollout is under way (an autoscaler at minReplicas 0 keeps a replica).
    `running_hold`: the hold derived from the cold start that the applied router ConfigMap records,
    kept while the deployment has replicas and only raised at zero (render/scale_to_zero.py hold_seconds)."""
    check_release(ld, images)
    revision = revision or revision_of(ld.spec, images)
    model, location, fetch, model_record = _model(ld, images, models, fetch_max_bytes_per_second)
    jobs: list[dict[str, Any]] = [fetch] if fetch is not None else []
    engines: dict[str, PoolEngine] = {}
    statuses: dict[str, PoolEngineStatus] = {}
    record: list[str] = []
    needs: list[ClaimNeed] = []
    model_ready = model.state in MODEL_READY
    for pool in plan.pools:
        if not needs_engine(ld):
            engines[pool.name] = PoolEngine(None, None, True)
            statuses[pool.name] = PoolEngineStatus(EngineState.NOT_NEEDED)
        elif ld.spec.engine.prebuilt is not None:
            uri = ld.spec.engine.prebuilt.uri
            engines[pool.name] = PoolEngine(engine_location(uri, None), None, True)
            statuses[pool.name] = PoolEngineStatus(EngineState.READY, uri=uri)
        elif not model_ready:  # the engine's key needs the model's resolved revision
            engines[pool.name] = PoolEngine(None, None, False)
            why = f"waiting for model {model.cache_key} to be cached (Job {model.job})" if model.job else ""
            statuses[pool.name] = PoolEngineStatus(EngineState.WAITING, message=why)
        else:
            built = _built_engine(
                ld, pool, images, builds, model.observed.resolved_revision or None, location
            )
            engines[pool.name], statuses[pool.name] = built.engine, built.status
            if built.job is not None:
                jobs.append(built.job)
            if built.need is not None:
                needs.append(built.need)
            if built.newly_built and built.engine.cache_key:
                record.append(built.engine.cache_key)
    if not model_ready:
        engines = {n: replace(e, ready=False) for n, e in engines.items()}
    children = slot_children(
        ld, plan, images, engines, slot=slot, revision=revision, leader_worker_set=leader_worker_set,
        model=location,
    )  # fmt: skip
    shared = shared_children(deployment or ld, images, prometheus_url=prometheus_url, canary=canary,
                             metrics_peers=metrics_peers, keep_any_source=keep_any_source,
                             keda_namespace=keda_namespace, running_hold=running_hold)  # fmt: skip
    return Desired(
        plan, jobs, children, shared, statuses, tuple(dict.fromkeys(record)), slot, revision, tuple(needs),
        model, model_record,
    )  # fmt: skip


def in_place_model(spec: LLMDeploymentSpec) -> ModelLocation | None:
    """A model that is not fetched, read in place: a pvc:// source of the backends that read a
    checkpoint; None for builtin:// and for engine builds (their Job mounts the claim itself)."""
    reads = spec.engine.backend in (Backend.PYTORCH, Backend.CPU_REFERENCE)
    uri = spec.model.source.uri
    return checkpoint_location(uri) if reads and uri.startswith("pvc://") else None


def _model(
    ld: LLMDeployment, images: Images, models: ModelLookup | None, max_bytes_per_second: int | None
) -> tuple[ModelStatus, ModelLocation | None, dict[str, Any] | None, dict[str, str]]:
    """Where the pods read the model's files once it is there, the fetch Job while it is not, and
    the index entry of a fetch that just succeeded."""
    spec = ld.spec
    request = model_request(spec)
    if request is None:
        return ModelStatus(ModelState.NOT_CACHED), in_place_model(spec), None, {}
    job_name = names.model_fetch_job(ld.name, request.fetch_key)
    seen = models(ld.namespace, request.fetch_key, job_name) if models else ModelObserved(ModelFact.ABSENT)
    if seen.fact in (ModelFact.RECORDED, ModelFact.COMPLETE):
        location = cached_model(request.claim, seen.directory)
        record = {} if seen.fact == ModelFact.RECORDED else {request.fetch_key: index_value(seen)}
        done = job_name if seen.fact == ModelFact.COMPLETE else ""
        return ModelStatus(ModelState.READY, request.fetch_key, done, seen), location, None, record
    if seen.fact == ModelFact.FAILED:
        return ModelStatus(ModelState.FAILED, request.fetch_key, job_name, seen), None, None, {}
    job = fetch_job(
        ld.name, ld.namespace, spec, request, image=images.fetch, owner=owner_reference(ld),
        max_bytes_per_second=max_bytes_per_second,
    )  # fmt: skip
    return ModelStatus(ModelState.FETCHING, request.fetch_key, job_name, seen), None, job, {}


def index_value(seen: ModelObserved) -> str:
    """The llm-model-cache-index entry of a fetched model (controller/observe/model_cache.py reads it)."""
    return json.dumps(
        {"directory": seen.directory, "resolvedRevision": seen.resolved_revision, "bytes": seen.bytes,
         "files": seen.files},
        sort_keys=True,
    )  # fmt: skip


@dataclass(frozen=True)
class _PoolBuild:
    engine: PoolEngine
    status: PoolEngineStatus
    job: dict[str, Any] | None = None  # the build Job, while the engine does not exist yet
    newly_built: bool = False  # its Job succeeded and the index does not say so yet
    need: ClaimNeed | None = None  # the Job's space on the pvc:// engine cache


def _built_engine(
    ld: LLMDeployment,
    pool: PoolPlan,
    images: Images,
    builds: BuildLookup,
    model_revision: str | None,
    model: ModelLocation | None,
) -> _PoolBuild:
    """The engine a pool serves from the cache, and what it takes to get there."""
    spec = ld.spec
    version = trtllm_version(ld, images)
    key = cache_key(spec, pool, version, model_revision)
    location = engine_location(spec.engine.cache.uri, key)
    uri = f"{spec.engine.cache.uri.rstrip('/')}/{key}"
    job_name = names.engine_job(ld.name, pool, key)
    seen = builds(ld.namespace, key, job_name)
    ready, missing = PoolEngine(location, key, True), PoolEngine(location, key, False)
    if seen.fact == BuildFact.RECORDED:
        return _PoolBuild(ready, PoolEngineStatus(EngineState.READY, key, uri))
    if seen.fact == BuildFact.COMPLETE:
        return _PoolBuild(ready, PoolEngineStatus(EngineState.READY, key, uri, job_name), newly_built=True)
    if seen.fact == BuildFact.FAILED:
        message = f"engine build Job {job_name} failed: {seen.message}"
        return _PoolBuild(missing, PoolEngineStatus(EngineState.FAILED, key, uri, job_name, message))
    job = build_job(
        ld.name,
        ld.namespace,
        spec,
        pool,
        key,
        image=builder_image(ld, images, version),
        images=images,
        owner=owner_reference(ld),
        trtllm_version=version,  # the builder refuses an image of another version (exit 78)
        model=model,
    )
    message = f"building engine {key} (Job {job_name})"
    size = build_size(spec, pool, min(pool.world_size, pool.gpus_per_pod))
    need = None
    if location.claim is not None and size is not None:
        need = ClaimNeed(location.claim, size.scratch, key, job_name, spec.engine.cache.uri)
    return _PoolBuild(
        missing, PoolEngineStatus(EngineState.BUILDING, key, uri, job_name, message), job, need=need
    )
