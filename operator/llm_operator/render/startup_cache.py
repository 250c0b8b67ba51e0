"""The pytorch backend's start-up caches, kept on the model cache's claim and reused by the next pod
(docs/autoscaling.md, "What a cold start caches"). Pure.

What a GPU pod of the pytorch backend computes at every start that a later pod of the same model,
release, GPU and layout could read instead, each where its own library looks (upstream sources):

- TensorRT-LLM's autotuner: the kernel tactics its warm-up profiles. `TLLM_AUTOTUNER_CACHE_PATH`,
  a file path, read by NVIDIA/TensorRT-LLM `tensorrt_llm/_torch/pyexecutor/model_engine.py`
  (`_run_autotuner_warmup`: `autotune(cache_path=...)`); `tensorrt_llm/_torch/autotuner.py` loads
  what is there before tuning, tunes only what it lacks, and writes it back after (added by PR #7738,
  commit 28b9a81c, on main on 2025-09-29 just before the 1.2.0rc0 bump: in 1.2.x; whether the
  v1.1.0 tag has it could not be read here, and a release without it ignores the variable). The file
  records its library version and GPU but does not check them on load, so the directory's key
  carries the release (the image), the GPU product, the layout and the precision.
- torch.compile (Inductor) and OpenAI Triton's JIT kernels: `TORCHINDUCTOR_CACHE_DIR`
  (pytorch/pytorch `torch/_inductor/runtime/cache_dir_utils.py`, `cache_dir()`; default
  /tmp/torchinductor_<user>) and `TRITON_CACHE_DIR` (triton-lang/triton `python/triton/knobs.py`,
  `cache_knobs.dir`; default ~/.triton/cache). Both key their entries by content (source, versions,
  GPU) and write them atomically, so any pod may share them.
- FlashInfer's JIT-compiled kernels and downloaded cubins, where TensorRT-LLM uses FlashInfer:
  `FLASHINFER_WORKSPACE_BASE` (flashinfer-ai/flashinfer `flashinfer/jit/env.py`: the cache is
  <base>/.cache/flashinfer/, default under HOME).

Without the caches each of these lands in the pod's emptyDirs (HOME, /tmp) and goes with the pod.
Only with a model cache (s3:// and hf:// sources): a pvc:// checkpoint's claim is the user's data,
mounted read-only, and builtin:// models run on CPU. The claim is mounted a second time, read-write,
at this directory alone, so a serving pod can write its caches and never the weights: the kubelet
creates a missing subPath with the mode of the volume's root (kubernetes/kubernetes
pkg/kubelet/kubelet_pods.go, makeMounts: SafeMakeDir), which the fetch Job's fsGroup made
group-writable, and the directory's group follows the root's (set-group-ID).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from llm_operator.api.v1alpha1 import Backend, LLMDeploymentSpec
from llm_operator.contract import AUTOTUNER_CACHE_ENV, MODEL_CACHE_MOUNT, STARTUP_CACHE_MOUNT
from llm_operator.plan.types import PoolPlan
from llm_operator.render.model_fetch import FETCH_UID
from llm_operator.storage import ModelLocation

VOLUME = "startup-cache"
MODELS = "models/"  # the model cache's directories: models/<source key>/<resolved revision>
# Each library's place under STARTUP_CACHE_MOUNT. The autotuner's is a file: upstream writes it
# (or one file per rank beside it, autotuner.rank<N>.json) and creates its directory.
ENV = {
    AUTOTUNER_CACHE_ENV: "autotuner/autotuner.json",
    "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
    "TRITON_CACHE_DIR": "triton",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",
}


@dataclass(frozen=True)
class StartupCache:
    claim: str
    sub_path: str  # startup/<source key>/<resolved revision>/<key> inside the claim

    def add_to(self, pod_spec: dict[str, Any]) -> None:
        """The volume, its mount and the variables in a serving pod's spec. A variable the user set
        (spec.runtime.env) is theirs; the claim's files belong to the fetch Job's group, which the
        pod gets as its fsGroup (OnRootMismatch: a claim already of that group is not walked)."""
        pod_spec["volumes"].append({"name": VOLUME, "persistentVolumeClaim": {"claimName": self.claim}})
        container = pod_spec["containers"][0]
        container["volumeMounts"].append(
            {"name": VOLUME, "mountPath": STARTUP_CACHE_MOUNT, "subPath": self.sub_path}
        )
        taken = {e["name"] for e in container["env"]}
        container["env"] += [
            {"name": name, "value": f"{STARTUP_CACHE_MOUNT}/{path}"}
            for name, path in ENV.items()
            if name not in taken
        ]
        pod_spec["securityContext"].setdefault("fsGroup", FETCH_UID)
        pod_spec["securityContext"].setdefault("fsGroupChangePolicy", "OnRootMismatch")


def startup_cache(
    spec: LLMDeploymentSpec, pool: PoolPlan, image: str, trtllm_version: str, model: ModelLocation | None
) -> StartupCache | None:
    """Where this pool's pods keep their start-up caches: beside the model's directory, keyed by
    what makes a cached tactic or kernel right for another pod (the release and its image, the GPU
    product, tensor x pipeline parallelism and the precision). None where nothing is kept."""
    if spec.engine.backend != Backend.PYTORCH or model is None or model.mount != MODEL_CACHE_MOUNT:
        return None
    if not model.path.startswith(MODELS):
        return None
    image_hash = hashlib.sha256(image.encode()).hexdigest()[:8]
    key = (
        f"trtllm-{trtllm_version or 'unknown'}-{pool.gpu_product}-tp{pool.tensor}-pp{pool.pipeline}-"
        f"{spec.engine.precision.value}-{image_hash}"
    )
    return StartupCache(model.claim, f"startup/{model.path.removeprefix(MODELS)}/{key}")
