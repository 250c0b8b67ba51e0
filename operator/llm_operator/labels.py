"""Label and annotation keys the operator stamps on its children (one place, used everywhere)."""

from __future__ import annotations

from llm_operator.api.v1alpha1 import GROUP

FIELD_MANAGER = "llm-operator"
MANAGED_BY = "app.kubernetes.io/managed-by"
NAME = "app.kubernetes.io/name"
INSTANCE = "app.kubernetes.io/instance"
COMPONENT = "app.kubernetes.io/component"

DEPLOYMENT = f"{GROUP}/deployment"  # the owning LLMDeployment's name; the scale selector
POOL = f"{GROUP}/pool"
REVISION = f"{GROUP}/revision"  # the deployment revision a pod serves (rollout/revision.py)
TEMPLATE_HASH = f"{GROUP}/template-hash"  # hash of one pod template: pods roll when it changes
SLOT = f"{GROUP}/slot"  # a | b: which of the (at most two) sets of serving objects
ROLE = f"{GROUP}/role"  # leader | worker (multi-node groups); leader for single-pod replicas
GROUP_INDEX = f"{GROUP}/group"  # replica index of a multi-node group
GROUP_SIZE = f"{GROUP}/group-size"  # pods per multi-node replica
ENGINE_KEY = f"{GROUP}/engine-key"
MODEL_FETCH_KEY = f"{GROUP}/model-fetch-key"  # a fetch Job and its pod: the model cache index key
# Annotation: digest of the rendered object last applied. A restarted or newly elected operator
# finds its predecessor's work in it and writes nothing where nothing changed.
APPLIED = f"{GROUP}/applied"
# Annotation of an LLMDeployment: the TensorRT-LLM release it runs, recorded at its first
# reconcile, so a later operator default moves no existing deployment (release_pin.py).
TRTLLM_VERSION = f"{GROUP}/tensorrt-llm-version"
# Annotation of a router ConfigMap: the hold derived from the cold start that it carries, kept while
# the deployment has replicas and only raised at zero (render/scale_to_zero.py hold_seconds).
DERIVED_HOLD = f"{GROUP}/derived-hold-seconds"

GPU_RESOURCE = "nvidia.com/gpu"
# GPU nodes are commonly tainted with their resource name: every GPU pod tolerates it.
GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
GPU_PRODUCT = "nvidia.com/gpu.product"
GPU_COUNT = "nvidia.com/gpu.count"
GPU_MEMORY = "nvidia.com/gpu.memory"
GPU_FAMILY = "nvidia.com/gpu.family"
GPU_CC_MAJOR = "nvidia.com/gpu.compute.major"
GPU_CC_MINOR = "nvidia.com/gpu.compute.minor"
GPU_CLIQUE = "nvidia.com/gpu.clique"
# The node's CUDA driver (GPU Feature Discovery; NVIDIA/k8s-device-plugin internal/lm/nvml.go,
# newVersionLabeler, at v0.20.0): (major, minor, revision) under the names GFD uses since v0.15.0,
# then the older ones, which v0.20.0 still writes (marked deprecated) and older GFD writes alone.
CUDA_DRIVER_LABELS = (
    ("nvidia.com/cuda.driver-version.major", "nvidia.com/cuda.driver-version.minor",
     "nvidia.com/cuda.driver-version.revision"),
    ("nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor", "nvidia.com/cuda.driver.rev"),
)  # fmt: skip
ZONE = "topology.kubernetes.io/zone"
HOSTNAME = "kubernetes.io/hostname"


def selector_labels(deployment: str) -> dict[str, str]:
    """Labels every serving pod of a deployment carries; status.selector is built from these."""
    return {DEPLOYMENT: deployment}


def common_labels(deployment: str, component: str) -> dict[str, str]:
    return {
        NAME: "llm-operator",
        INSTANCE: deployment,
        COMPONENT: component,
        MANAGED_BY: "llm-operator",
        DEPLOYMENT: deployment,
    }


def slot_labels(deployment: str, component: str, pool: str, slot: str) -> dict[str, str]:
    """Labels of a per-slot object of one pool (serving objects and their pods, model repository)."""
    return {**common_labels(deployment, component), POOL: pool, SLOT: str(slot)}  # a plain str, for YAML
