"""The serving-pod contract: what the workload builders (render/serving.py) put into a serving pod
and what the launcher (runtime/) reads from it. One place, so the two cannot drift.

Stdlib only, and nothing from this package: it is copied into NVIDIA's images beside the launcher
(llm_operator/inject.py). docs/launcher-and-engines.md explains every value.
"""

from __future__ import annotations

import json
from pathlib import Path

LAUNCHER = "llm-operator-launch"  # its name in logs (and the console script of a dev install)
# Run with the serving image's own python3 from the injected copy (render/inject.py), so NVIDIA's
# image runs unchanged.
CONTAINER_COMMAND = ("python3", "-m", "llm_operator.runtime.launcher")
PRESTOP_COMMAND = (*CONTAINER_COMMAND, "drain")

# Rank 0's endpoints (workers have no HTTP server).
HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
# The OpenAI-compatible API (/v1), served on the leader by a process the launcher supervises beside
# Triton (docs/architecture.md, "The serving pod"); the container port and Service port `openai`.
OPENAI_PORT = 8080

MODEL_REPO_SRC = "/etc/llm-operator/model-repo"  # the ConfigMap, read-only
MODEL_REPO = "/var/run/llm-operator/model-repo"  # materialized by the launcher at start
ENGINE_CACHE_MOUNT = "/engine-cache"  # the engine cache claim (read-only in serving pods)
TOKENIZER_MOUNT = "/tokenizer-source"  # runtime.tokenizerUri's claim, read-only
CHECKPOINT_MOUNT = "/checkpoint"  # the pytorch backend's pvc:// checkpoint claim, read-only
# spec.model.cache.claimName: read-write in the fetch Job, read-only (whole claim) in serving pods
# and engine builds; models live at models/<source key>/<resolved revision>/ inside it.
MODEL_CACHE_MOUNT = "/var/lib/llm-operator/model-cache"
# The pytorch backend's start-up caches (render/startup_cache.py): one directory of the model
# cache's claim, read-write, at startup/<source key>/<resolved revision>/<release, GPU, layout>/.
STARTUP_CACHE_MOUNT = "/var/cache/llm-operator/startup"
# TensorRT-LLM's autotuner cache: a file path (NVIDIA/TensorRT-LLM tensorrt_llm/_torch/pyexecutor/
# model_engine.py reads it), under STARTUP_CACHE_MOUNT; the launcher drops a torn one before start.
AUTOTUNER_CACHE_ENV = "TLLM_AUTOTUNER_CACHE_PATH"
# The cpu-reference models' Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json
# with its chat template), written into the cpu-runtime image when it is built
# (runtime/cpu_reference/tokenizer_files.py): the tokenizer directory of every cpu-reference pod.
CPU_REFERENCE_TOKENIZER_DIR = "/opt/llm-operator/cpu-reference-tokenizer"
# spec.routing.apiKeys: the Secret's keys, one file each, read by the front door (leaders only).
API_KEYS_DIR = "/etc/llm-operator/api-keys"
API_KEYS_VOLUME = "api-keys"
# xgrammar's view of the engine's tokenizer, which the C++ backend's guided decoder loads
# (`xgrammar_tokenizer_info_path`): the engine build writes it beside the engine
# (engine/tokenizer_info.py) under the name upstream's examples/generate_xgrammar_tokenizer_info.py
# gives it. An engine without a file tokenizer_info_problem() passes (built by an operator before
# this file, prebuilt without it, or a torn copy) serves unguided: the launcher empties the two
# parameters (the backend fails the model's load on a missing or unreadable file) and the front
# door refuses guides.
XGRAMMAR_TOKENIZER_INFO = "xgrammar_tokenizer_info.json"
# What the backend reads from it, each with nlohmann::json get<> of this type, outside any try:
# getGuidedDecodingConfigFromParams in triton_backend/inflight_batcher_llm/src/model_instance_state.cc
# (NVIDIA/TensorRT-LLM, stored copy 0c8de69a; tests/upstream_names.py pins the keys).
XGRAMMAR_TOKENIZER_INFO_KEYS = ("encoded_vocab", "tokenizer_str", "stop_token_ids")
# Multi-node pods: their role's half of the launch Secret, read-only (runtime/launch_agent.py).
LAUNCH_IDENTITY_DIR = "/etc/llm-operator/launch"
RUNTIME_DIR = "/tmp/llm-operator"  # 0700: the launcher's own files (its PID for the preStop)
TMP_DIR = "/tmp"  # an emptyDir (the root filesystem is read-only): RUNTIME_DIR lives in it
HOME_DIR = "/var/run/llm-operator/home"  # an emptyDir: HOME of mpirun and Triton's backends
# Kubernetes' default terminationMessagePath: why the launcher failed, read into the container's
# lastState.terminated.message (the operator reports it on a crash loop).
TERMINATION_LOG = "/dev/termination-log"

# Files of the launch Secret: two self-signed certificates (PEM) and their keys. A leader mounts its
# own pair and the workers' certificate, a worker its own pair and the leader's certificate: each
# side of the launch agent's mutual TLS trusts exactly the other's certificate.
LEADER_CERT = "leader.crt"
LEADER_KEY = "leader.key"
WORKER_CERT = "worker.crt"
WORKER_KEY = "worker.key"
LEADER_LAUNCH_FILES = (LEADER_CERT, LEADER_KEY, WORKER_CERT)
WORKER_LAUNCH_FILES = (WORKER_CERT, WORKER_KEY, LEADER_CERT)
LAUNCH_VOLUME = "launch-identity"

# Triton's admin APIs (runtime/commands.py restricted_api_args) answer only requests that carry
# this header (gRPC: `triton-grpc-protocol-<header>` metadata) with the key from the deployment's
# admin-key Secret (controller/secrets/admin_key.py), which reaches the leader as ADMIN_KEY_ENV.
ADMIN_KEY_ENV = "LLMOP_ADMIN_KEY"
# The launcher runs itself again without ADMIN_KEY_ENV, handing the key over a pipe (this names
# its descriptor), so that no process's startup environment keeps it (runtime/launcher.py).
ADMIN_KEY_FD_ENV = "LLMOP_ADMIN_KEY_FD"
ADMIN_KEY_HEADER = "llm-operator-admin-key"
ADMIN_KEY_SECRET_KEY = "admin-key"  # the key of the Secret's data

EXIT_TIMEOUT_SECONDS = 30  # Triton's --exit-timeout-secs unless the spec says otherwise
DRAIN_TIMEOUT_SECONDS = 20  # longest preStop drain, settle time included
DRAIN_SETTLE_SECONDS = 5  # preStop: wait for endpoint removal to reach proxies
KILL_GRACE_SECONDS = 5  # the launcher's wait between the last SIGTERM and SIGKILL


def termination_grace_seconds(exit_timeout_seconds: int) -> int:
    """Kubernetes' budget for a serving pod: preStop drain, Triton's exit timeout, the launcher's
    SIGKILL grace, plus slack for the kubelet."""
    return DRAIN_TIMEOUT_SECONDS + exit_timeout_seconds + KILL_GRACE_SECONDS + 5


def tokenizer_info_problem(path: str | Path) -> str:
    """Why the guided decoder could not load the tokenizer info file at `path`, "" when it can: the
    file parses and holds encoded_vocab (strings), tokenizer_str (a string) and stop_token_ids
    (int32s). One check for the build (which publishes no other file), the launcher and the front
    door (which serve unguided otherwise), so that they agree."""
    try:
        info = json.loads(Path(path).read_bytes())
    except FileNotFoundError:
        return f"{path} not found"
    except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return f"{path} cannot be read as JSON ({type(e).__name__}: {e})"
    if not isinstance(info, dict):
        return f"{path} holds no JSON object"
    vocab, text, stops = (info.get(k) for k in XGRAMMAR_TOKENIZER_INFO_KEYS)
    if not isinstance(vocab, list) or not vocab or not all(isinstance(t, str) for t in vocab):
        return f"{path}: encoded_vocab is not a non-empty list of strings"
    if not isinstance(text, str):
        return f"{path}: tokenizer_str is not a string"
    ids = stops if isinstance(stops, list) else [None]
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 2**31 for i in ids):  # int32
        return f"{path}: stop_token_ids is not a list of token ids"
    return ""


# Every variable the launcher reads, with its default ("" = unset).
# How a multi-node leader's front door begins the line that says its group stalled
# (frontdoor/stall.py): the launcher keeps that line for the pod's termination message.
STALLED_PREFIX = "stalled: "

ENV: dict[str, str] = {
    "LLMOP_BACKEND": "tensorrt-engine",
    "LLMOP_TP": "1",
    "LLMOP_PP": "1",
    "LLMOP_GPUS_PER_POD": "1",
    "LLMOP_PODS_PER_REPLICA": "1",
    "LLMOP_MODEL_REPO_SRC": MODEL_REPO_SRC,
    "LLMOP_MODEL_REPO": MODEL_REPO,
    "LLMOP_ENGINE_DIR": "",
    "LLMOP_TOKENIZER_DIR": "",
    # The model's files (config.json, weights, tokenizer) when the source is cached or a pvc://
    # directory ("" = the backend's builtin model).
    "LLMOP_MODEL_DIR": "",
    "LLMOP_HTTP_PORT": str(HTTP_PORT),
    "LLMOP_GRPC_PORT": str(GRPC_PORT),
    "LLMOP_METRICS_PORT": str(METRICS_PORT),
    "LLMOP_OPENAI_PORT": str(OPENAI_PORT),
    # The names /v1/models lists and requests may name (comma-separated): spec.model.name, then
    # spec.model.alias when set.
    "LLMOP_SERVED_MODEL_NAMES": "",
    "LLMOP_API_KEYS_DIR": "",
    # The engine's limits, which the front door checks before Triton would refuse less helpfully
    # ("" = not checked there): spec.engine.maxInputLen and maxSeqLen.
    "LLMOP_MAX_INPUT_LEN": "",
    "LLMOP_MAX_SEQ_LEN": "",
    # spec.model.toolCallParser: how the front door reads tool calls out of the text ("" = none:
    # tool_choice auto is refused).
    "LLMOP_TOOL_CALL_PARSER": "",
    "LLMOP_EXIT_TIMEOUT_SECONDS": str(EXIT_TIMEOUT_SECONDS),
    "LLMOP_DRAIN_TIMEOUT_SECONDS": str(DRAIN_TIMEOUT_SECONDS),
    "LLMOP_DRAIN_SETTLE_SECONDS": str(DRAIN_SETTLE_SECONDS),
    # pytorch: a cpu-reference pod whose CPU runtime speaks the LLM API contract ("": the ensemble's).
    "LLMOP_CONTRACT": "",
    "LLMOP_ROLE": "leader",
    "LLMOP_GROUP_INDEX": "0",
    "LLMOP_WORKER_HOST_PATTERN": "",
    "LLMOP_WORKER_WAIT_SECONDS": "600",
    # A multi-node leader's front door: seconds without any response from Triton while requests are
    # in flight before it ends the pod as stalled (frontdoor/stall.py; spec.runtime.stallTimeoutSeconds).
    # 0: not watched (single pods: the kubelet's liveness probe on Triton finds a frozen server).
    "LLMOP_STALL_TIMEOUT_SECONDS": "0",
    "LLMOP_LEADER_HOST": "",
    "LLMOP_LAUNCH_IDENTITY_DIR": LAUNCH_IDENTITY_DIR,
    "LLMOP_LAUNCH_PORT": "2222",
    "LLMOP_RUNTIME_DIR": RUNTIME_DIR,
    "LLMOP_TRITONSERVER": "tritonserver",
    "LLMOP_MPIRUN": "mpirun",
    # Installed on PATH by the tensorrt_llm wheel (setup.py `scripts`); the pytorch backend's
    # multi-node ranks run under it (runtime/commands.py). The cpu-runtime image sets its own
    # (runtime/cpu_reference/launch.py).
    "LLMOP_LLMAPI_LAUNCH": "trtllm-llmapi-launch",
    "LLMOP_BACKEND_DIR": "",
    "LLMOP_TRTLLM_MODELS_DIR": "/app/all_models/inflight_batcher_llm",
    # Where NVIDIA's tritonserver trtllm image keeps the llmapi model (TensorRT-LLM's
    # triton_backend docs: `cp -R /app/all_models/llmapi/ llmapi_repo/`).
    "LLMOP_LLMAPI_MODELS_DIR": "/app/all_models/llmapi",
    "LLMOP_TERMINATION_LOG": TERMINATION_LOG,
    ADMIN_KEY_ENV: "",  # unset: the launcher restricts with a key of its own that nobody holds
}
# Set by the builders for logs only (the downward API), not read by the launcher.
POD_NAME_ENV = "POD_NAME"
