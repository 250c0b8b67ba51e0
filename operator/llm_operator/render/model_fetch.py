"""The model's fetch Job: one CPU-only pod of the fetch image that downloads an s3:// or hf://
source into spec.model.cache's claim (llm_operator/modelcache/, docs/architecture.md "The
model's files, once"). Pure; the reconciler creates it once and reads its outcome
(controller/observe/model_cache.py).

Its result is the termination message (JSON, terminationMessagePolicy File), its progress the
last lines of its log. Exit 78 is a permanent failure (wrong credentials, a missing bucket or
revision, a full claim): the podFailurePolicy fails the Job at once instead of retrying; any
other failure is retried by the Job (backoffLimit), and the new pod resumes where the last one
stopped (verified files are kept).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llm_operator import labels as L
from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.contract import MODEL_CACHE_MOUNT, TERMINATION_LOG
from llm_operator.modelcache.keys import fetch_key, source_key
from llm_operator.render import names

MODEL_INDEX = "llm-model-cache-index"  # per namespace: fetch key -> the fetched model (JSON)
EXIT_PERMANENT = 78  # the fetcher's "retrying cannot help" (os.EX_CONFIG)
FETCH_UID = 1000  # the fetch image's USER (images/fetch.Dockerfile)
TERMINATION_GRACE_SECONDS = 2
BACKOFF_LIMIT = 4  # transient failures (a dropped connection, a killed pod); each retry resumes
CACHE_VOLUME = "model-cache"
# Downloading is network- and disk-bound: a fraction of a core; memory holds a part's buffers.
RESOURCES = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}


@dataclass(frozen=True)
class ModelRequest:
    """What a deployment asks of the model cache: the claim, the source and revision, and the
    keys that name them."""

    claim: str
    uri: str
    endpoint: str | None
    revision: str | None  # hf:// only, "main" when the spec gives none
    source_key: str
    fetch_key: str


def model_request(spec: LLMDeploymentSpec) -> ModelRequest | None:
    """None for sources read in place (pvc://, builtin://)."""
    model = spec.model
    if model.cache is None:
        return None
    source = model.source
    revision = model.requested_revision
    return ModelRequest(
        claim=model.cache.claim_name,
        uri=source.uri,
        endpoint=source.endpoint,
        revision=revision,
        source_key=source_key(source.uri, source.endpoint),
        fetch_key=fetch_key(model.cache.claim_name, source.uri, source.endpoint, revision),
    )


def fetch_args(spec: LLMDeploymentSpec, request: ModelRequest, max_bytes_per_second: int | None) -> list[str]:
    source = spec.model.source
    args = ["--uri", request.uri, "--source-key", request.source_key, "--cache-root", MODEL_CACHE_MOUNT]
    if request.revision is not None:
        args += ["--revision", request.revision]
    if source.endpoint is not None:
        args += ["--endpoint", source.endpoint]
    if source.region is not None:
        args += ["--region", source.region]
    if source.path_style:
        args.append("--path-style")
    if max_bytes_per_second is not None:
        args += ["--max-bytes-per-second", str(max_bytes_per_second)]
    return args


def fetch_job(
    deployment: str,
    namespace: str,
    spec: LLMDeploymentSpec,
    request: ModelRequest,
    *,
    image: str,
    owner: dict[str, Any],
    max_bytes_per_second: int | None = None,
) -> dict[str, Any]:
    """The Job that fetches `request` into its claim. Credentials come only from the Secret the
    spec names (envFrom); nothing else secret reaches the pod."""
    labels = {**L.common_labels(deployment, "model-fetch"), L.MODEL_FETCH_KEY: request.fetch_key}
    container: dict[str, Any] = {
        "name": "fetch",
        "image": image,
        "command": ["python3", "-m", "llm_operator.modelcache.fetch"],
        "args": fetch_args(spec, request, max_bytes_per_second),
        # No passwd entry for the uid; HOME keeps boto3's and huggingface_hub's caches writable.
        "env": [{"name": "HOME", "value": "/tmp"}],
        "resources": {k: dict(v) for k, v in RESOURCES.items()},
        "volumeMounts": [
            {"name": CACHE_VOLUME, "mountPath": MODEL_CACHE_MOUNT},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
        # The fetcher writes its result as JSON there; a crash leaves nothing rather than a log
        # tail the operator would have to tell from a result.
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "File",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
        },
    }
    ref = spec.model.source.credentials_secret_ref
    if ref is not None:
        container["envFrom"] = [{"secretRef": {"name": ref.name}}]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": names.model_fetch_job(deployment, request.fetch_key),
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [owner],
        },
        "spec": {
            "backoffLimit": BACKOFF_LIMIT,
            # The operator reads the outcome from the Job and its pod, so both are kept.
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": "fetch",
                            "operator": "In",
                            "values": [EXIT_PERMANENT],
                        },
                    },
                    # A node drained or a pod preempted is not the fetch's fault: not counted.
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                ]
            },
            "template": {
                "metadata": {
                    "labels": {**spec.runtime.pod_labels, **labels},
                    **({"annotations": spec.runtime.pod_annotations} if spec.runtime.pod_annotations else {}),
                },
                "spec": {
                    "restartPolicy": "Never",
                    # A stopped fetch needs no grace: each file is recorded as it is verified, and
                    # the fetcher, PID 1 without a SIGTERM handler, would ignore SIGTERM and go on
                    # downloading through the default 30 s (a deleted pod finishing its fetch).
                    "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": FETCH_UID,
                        "runAsGroup": FETCH_UID,
                        "fsGroup": FETCH_UID,
                        # A claim already holding models is not walked (it may be large).
                        "fsGroupChangePolicy": "OnRootMismatch",
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    **_placement(spec),
                    **spec.runtime.pod_identity(),
                    "containers": [container],
                    "volumes": [
                        {"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": request.claim}},
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            },
        },
    }


def _placement(spec: LLMDeploymentSpec) -> dict[str, Any]:
    """The user's node selector, tolerations and priority (where the claim can be mounted); no
    GPU toleration: it needs no GPU."""
    out: dict[str, Any] = {}
    if spec.placement.node_selector:
        out["nodeSelector"] = dict(spec.placement.node_selector)
    if spec.placement.tolerations:
        out["tolerations"] = [dict(t) for t in spec.placement.tolerations]
    if spec.placement.priority_class_name:
        out["priorityClassName"] = spec.placement.priority_class_name
    return out
