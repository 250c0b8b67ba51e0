"""The launcher's view of its pod: the environment (contract.ENV) parsed and checked once at start.

An inconsistent set is refused with a message naming the variable: the launcher exits 78 before
Triton could fail on it less helpfully.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from llm_operator.contract import ADMIN_KEY_ENV, ENV

BACKENDS = ("tensorrt-engine", "pytorch", "cpu-reference")
ROLES = ("leader", "worker")


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class PodConfig:
    backend: str
    tp: int
    pp: int
    gpus_per_pod: int
    pods_per_replica: int
    model_repo_src: str
    model_repo: str
    engine_dir: str
    tokenizer_dir: str  # pre/postprocessing's tokenizer_dir ("" when the backend has none)
    model_dir: str  # the cached model's directory on the model cache claim ("" when none)
    http_port: int
    grpc_port: int
    metrics_port: int
    exit_timeout: int
    drain_timeout: float
    drain_settle: float
    role: str  # leader | worker
    group: int
    worker_host_pattern: str  # leader of a multi-node group; {group} and {worker} placeholders
    worker_wait: float
    leader_host: str  # workers: where the leader's metrics are, for drain
    launch_identity_dir: str
    launch_port: int
    runtime_dir: str
    tritonserver: str
    mpirun: str
    llmapi_launch: str  # the multi-node launcher of the LLM API (pytorch; cpu-reference's own)
    backend_dir: str
    trtllm_models_dir: str
    llmapi_models_dir: str
    termination_log: str
    # Leaders with served model names run the OpenAI front door beside Triton (frontdoor/).
    served_model_names: str = ""
    python: str = "python3"  # the interpreter the launcher runs under (launcher.py _resolve)
    contract: str = ""  # cpu-reference: "pytorch" when its runtime speaks the LLM API contract
    # The key of Triton's restricted admin APIs; never printed (repr) nor logged.
    admin_key: str = field(default="", repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> PodConfig:
        def get(name: str) -> str:
            return environ.get(name) or ENV[name]

        def num(name: str) -> int:
            try:
                return int(get(name))
            except ValueError:
                raise ConfigError(f"{name}={environ.get(name)!r} is not an integer") from None

        c = cls(
            backend=get("LLMOP_BACKEND"),
            tp=num("LLMOP_TP"),
            pp=num("LLMOP_PP"),
            gpus_per_pod=num("LLMOP_GPUS_PER_POD"),
            pods_per_replica=num("LLMOP_PODS_PER_REPLICA"),
            model_repo_src=get("LLMOP_MODEL_REPO_SRC"),
            model_repo=get("LLMOP_MODEL_REPO"),
            engine_dir=get("LLMOP_ENGINE_DIR"),
            tokenizer_dir=get("LLMOP_TOKENIZER_DIR"),
            model_dir=get("LLMOP_MODEL_DIR"),
            http_port=num("LLMOP_HTTP_PORT"),
            grpc_port=num("LLMOP_GRPC_PORT"),
            metrics_port=num("LLMOP_METRICS_PORT"),
            exit_timeout=num("LLMOP_EXIT_TIMEOUT_SECONDS"),
            drain_timeout=num("LLMOP_DRAIN_TIMEOUT_SECONDS"),
            drain_settle=num("LLMOP_DRAIN_SETTLE_SECONDS"),
            role=get("LLMOP_ROLE"),
            group=num("LLMOP_GROUP_INDEX"),
            worker_host_pattern=get("LLMOP_WORKER_HOST_PATTERN"),
            worker_wait=num("LLMOP_WORKER_WAIT_SECONDS"),
            # LeaderWorkerSet injects LWS_LEADER_ADDRESS into every pod of a group.
            leader_host=get("LLMOP_LEADER_HOST") or environ.get("LWS_LEADER_ADDRESS", ""),
            launch_identity_dir=get("LLMOP_LAUNCH_IDENTITY_DIR"),
            launch_port=num("LLMOP_LAUNCH_PORT"),
            runtime_dir=get("LLMOP_RUNTIME_DIR"),
            tritonserver=get("LLMOP_TRITONSERVER"),
            mpirun=get("LLMOP_MPIRUN"),
            llmapi_launch=get("LLMOP_LLMAPI_LAUNCH"),
            backend_dir=get("LLMOP_BACKEND_DIR"),
            trtllm_models_dir=get("LLMOP_TRTLLM_MODELS_DIR"),
            llmapi_models_dir=get("LLMOP_LLMAPI_MODELS_DIR"),
            termination_log=get("LLMOP_TERMINATION_LOG"),
            served_model_names=get("LLMOP_SERVED_MODEL_NAMES"),
            contract=get("LLMOP_CONTRACT"),
            admin_key=get(ADMIN_KEY_ENV),
        )
        c.validate()
        return c

    def validate(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"LLMOP_BACKEND={self.backend!r}: expected one of {', '.join(BACKENDS)}")
        if min(self.tp, self.pp, self.pods_per_replica) < 1:
            raise ConfigError("LLMOP_TP, LLMOP_PP and LLMOP_PODS_PER_REPLICA must be >= 1")
        # The operator renders 0 GPUs for the cpu-reference backend: its pods request none.
        if self.gpus_per_pod < (0 if self.backend == "cpu-reference" else 1):
            raise ConfigError(
                f"LLMOP_GPUS_PER_POD={self.gpus_per_pod}: the {self.backend} backend needs >= 1"
            )
        # Triton splits `--http-restricted-api=APIS:HEADER=KEY` at the first `:` and `=` and echoes
        # the whole flag when it cannot: the operator's keys are hex (controller/secrets/admin_key.py).
        if self.admin_key and not re.fullmatch(r"[A-Za-z0-9_-]+", self.admin_key):
            raise ConfigError(f"{ADMIN_KEY_ENV} may hold only letters, digits, '-' and '_'")
        if self.role not in ROLES:
            raise ConfigError(f"LLMOP_ROLE={self.role!r}: expected leader or worker")
        if self.backend == "cpu-reference" and not self.multi_node:
            if self.world_size != 1:
                raise ConfigError("the cpu-reference backend runs one process per pod: tp = pp = 1")
        elif self.backend == "cpu-reference":
            # One pipeline stage per pod (runtime/cpu_reference/pipeline.py), launched as the
            # pytorch backend launches its ranks.
            if self.contract != "pytorch" or self.tp != 1 or self.pp != self.pods_per_replica:
                raise ConfigError(
                    "a cpu-reference group spans pods by pipeline stages, one per pod, on the LLM API "
                    "contract: LLMOP_TP=1, LLMOP_PP = LLMOP_PODS_PER_REPLICA, LLMOP_CONTRACT=pytorch"
                )
        elif self.multi_node:
            # Pod k of a group hosts ranks k*gpus_per_pod .. (k+1)*gpus_per_pod-1.
            if self.world_size != self.gpus_per_pod * self.pods_per_replica:
                raise ConfigError(
                    f"tp*pp = {self.world_size} must equal LLMOP_GPUS_PER_POD * LLMOP_PODS_PER_REPLICA "
                    f"= {self.gpus_per_pod * self.pods_per_replica}: one rank per GPU in every pod"
                )
            # The llmapi model's multi-node docs at TensorRT-LLM 1.1.0: "inter-node tensor
            # parallelism is not yet supported" (desired.py PyTorchTensorParallelAcrossPods).
            if self.backend == "pytorch" and self.tp > self.gpus_per_pod:
                raise ConfigError(
                    f"LLMOP_TP={self.tp} > LLMOP_GPUS_PER_POD={self.gpus_per_pod}: the pytorch backend "
                    "spans pods by pipeline stages only, each tensor-parallel group inside one pod"
                )
        if self.multi_node and self.role == "leader" and "{worker}" not in self.worker_host_pattern:
            raise ConfigError(
                "a multi-node leader needs LLMOP_WORKER_HOST_PATTERN with a {worker} placeholder"
            )
        if not self.multi_node:
            if self.backend != "cpu-reference" and self.world_size > self.gpus_per_pod:
                raise ConfigError(f"tp*pp = {self.world_size} ranks need {self.world_size} GPUs in this pod, "
                                  f"LLMOP_GPUS_PER_POD is {self.gpus_per_pod}")  # fmt: skip
            if self.role == "worker":
                raise ConfigError("LLMOP_ROLE=worker needs LLMOP_PODS_PER_REPLICA > 1")

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    @property
    def ranks_per_pod(self) -> int:
        """MPI ranks on each pod of a group: one per GPU; a CPU pod runs one pipeline stage."""
        return 1 if self.backend == "cpu-reference" else self.gpus_per_pod

    @property
    def llmapi_shape(self) -> bool:
        """One tritonserver on rank 0, the LLM API's other ranks no Triton ranks: the pytorch
        backend, and the cpu-reference one split over pods."""
        return self.backend == "pytorch" or (self.backend == "cpu-reference" and self.multi_node)

    @property
    def multi_node(self) -> bool:
        return self.pods_per_replica > 1

    @property
    def local_ranks(self) -> range:
        """Ranks this pod runs. Workers need not know their position: the leader's mpirun places
        ranks k*gpus_per_pod .. (k+1)*gpus_per_pod-1 on worker k by host order, so a worker
        watches for any rank of the world."""
        if self.llmapi_shape:
            # One tritonserver on the leader; the LLM API's workers are no Triton ranks.
            return range(1) if self.role == "leader" else range(0)
        if not self.multi_node:
            return range(self.world_size)
        return range(self.gpus_per_pod) if self.role == "leader" else range(self.world_size)
