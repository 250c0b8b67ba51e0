"""Deterministic child names, so a retried or repeated reconcile converges on the same objects."""

from __future__ import annotations

import hashlib

from llm_operator.plan.types import PoolPlan
from llm_operator.rollout.revision import Slot

MAX_NAME = 63  # DNS label: Service and StatefulSet names become pod host names
# A LeaderWorkerSet's worker StatefulSets are `<lws>-<group>` (group < 1000: 4 more characters), and
# the StatefulSet controller labels their pods `controller-revision-hash: <statefulset>-<hash>`
# (hash up to 10 characters), a label value of at most 63: 47 + 4 + 11 = 62.
MAX_LWS_NAME = 47


def _fit(name: str, limit: int = MAX_NAME) -> str:
    """Shorten over-long names with a stable hash suffix instead of failing at apply time."""
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: limit - 9].rstrip('-')}-{digest}"


def slot_base(deployment: str, slot: Slot = Slot.A) -> str:
    """What per-slot names start with: slot a keeps the names of operators before slots."""
    return deployment if slot == Slot.A else f"{deployment}-{slot.value}"


def serving(deployment: str, pool: PoolPlan | str, slot: Slot = Slot.A) -> str:
    """Leader StatefulSet of a pool; a single pool keeps the plain name."""
    name = pool if isinstance(pool, str) else pool.name
    base = slot_base(deployment, slot)
    return _fit(base if name == "main" else f"{base}-{name}")


def leader_worker_set(deployment: str, pool: PoolPlan | str, slot: Slot = Slot.A) -> str:
    """A pool's multi-node replicas as one LeaderWorkerSet, `<serving>-lws`. Not `<serving>`: LWS's
    controller names a headless Service after the LWS (its pods' subdomain), and for pool main in
    slot a that is the client Service's name, so the workers would get no DNS records. No Service
    the operator renders ends in `-lws`. Renaming works with every LWS release; the alternative,
    `networkConfig.subdomainPolicy: UniquePerReplica`, needs LWS v0.4.0 or newer (an older CRD
    drops the field and the shared Service collides again). docs/launcher-and-engines.md."""
    return _fit(f"{serving(deployment, pool, slot)}-lws", MAX_LWS_NAME)


def group_prefix(deployment: str, pool: PoolPlan | str, slot: Slot = Slot.A) -> str:
    return f"{serving(deployment, pool, slot)}-g"


def group(deployment: str, pool: PoolPlan | str, index: int, slot: Slot = Slot.A) -> str:
    """Worker StatefulSet of one multi-node replica (ranks gpus_per_pod and up of one world)."""
    return _fit(f"{group_prefix(deployment, pool, slot)}{index}")


def model_repo(deployment: str, pool: PoolPlan, content_hash: str, slot: Slot = Slot.A) -> str:
    """Named by its content: a changed model repository is a new, immutable ConfigMap, so a pod can
    never mount an older one (its kubelet waits until the named one exists)."""
    return _fit(f"{serving(deployment, pool, slot)}-model-repo-{content_hash}")


def client_service(deployment: str) -> str:
    return _fit(deployment)


def headless_service(deployment: str) -> str:
    return _fit(f"{deployment}-pods")


def disruption_budget(deployment: str, pool: PoolPlan, slot: Slot = Slot.A) -> str:
    return serving(deployment, pool, slot)


def network_policy(deployment: str) -> str:
    return _fit(deployment)


def revision_service(deployment: str, role: str) -> str:
    """`<name>-stable` / `<name>-canary`: the leaders of one revision (routing and analysis)."""
    return _fit(f"{deployment}-{role}")


def http_route(deployment: str) -> str:
    return _fit(deployment)


def controller_revision(deployment: str, revision: str) -> str:
    """The snapshot of one revision's spec."""
    return _fit(f"{deployment}-{revision}")


def autoscaler(deployment: str) -> str:
    return _fit(deployment)


def launch_secret(deployment: str, uid: str) -> str:
    """The launch identity of a deployment's multi-node groups (controller/secrets/launch.py); one
    per incarnation of the deployment (its UID), as the operator can create Secrets but not read
    one to check whose it is. `launch`, not the `sshkeys` of earlier operators: a Secret is never
    updated, and their key pairs are not what the launch agent uses."""
    return _fit(f"{deployment}-launch-{uid[:8]}" if uid else f"{deployment}-launch")


def admin_key_secret(deployment: str, uid: str) -> str:
    """The key of Triton's admin APIs in a deployment's pods (controller/secrets/admin_key.py); one per
    incarnation, like launch_secret."""
    return _fit(f"{deployment}-adminkey-{uid[:8]}" if uid else f"{deployment}-adminkey")


def picker_tls_secret(deployment: str, uid: str) -> str:
    """The endpoint picker's certificate (controller/secrets/picker_tls.py); one per incarnation, like
    launch_secret."""
    return _fit(f"{deployment}-pickertls-{uid[:8]}" if uid else f"{deployment}-pickertls")


def engine_job(deployment: str, pool: PoolPlan, cache_key: str) -> str:
    """Per deployment, not per slot: a build is keyed by its engine, whichever slot waits for it."""
    return _fit(f"{serving(deployment, pool)}-engine-{cache_key[-10:]}")


def router(deployment: str) -> str:
    """routing.mode inference-pool: the router's Deployment, Service, ConfigMap, ServiceAccount,
    Role and RoleBinding (render/router/objects.py); also the picker the InferencePool names."""
    return _fit(f"{deployment}-router")


def inference_pool(deployment: str) -> str:
    return _fit(deployment)


def model_fetch_job(deployment: str, fetch_key: str) -> str:
    """Per deployment and request (the fetch key): a revision change is a new Job, and a Job is
    never edited (its pod template is immutable)."""
    return _fit(f"{deployment}-fetch-{fetch_key[:10]}")
