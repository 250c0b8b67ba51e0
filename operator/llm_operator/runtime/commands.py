"""What the launcher runs, built from its PodConfig (pure): one tritonserver per rank in
TensorRT-LLM leader mode, one MPMD mpirun for a world of several ranks (the pytorch backend, and the
cpu-reference one split over pods: one tritonserver, under the LLM API's multi-node launcher when
the world spans pods), the launch agent on workers.

The rank layout is documented in docs/launcher-and-engines.md.
"""

from __future__ import annotations

import json
from pathlib import Path

from llm_operator.contract import ADMIN_KEY_HEADER
from llm_operator.runtime.config import PodConfig

# Latency quantiles (nv_inference_*_summary_us) and, from Triton 24.11, the time-to-first-response
# histogram (nv_inference_first_response_histogram_ms: TTFT of streaming requests). Older servers
# (the CPU runtime's 2.51) ignore the setting they do not know. docs/autoscaling.md.
METRICS_CONFIG = ("--metrics-config=summary_latencies=true", "--metrics-config=histogram_latencies=true")


# Triton's admin APIs, answered only with the admin key (docs/runtime.md "Triton's admin APIs").
# The names are the API groups of `--http-restricted-api` / `--grpc-restricted-protocol` in
# triton-inference-server/server docs/customization_guide/inference_protocols.md ("Limit Endpoint
# Access") and src/restricted_features.h at r25.12 (Triton 2.64.0, the default release); the CPU
# runtime's 2.51 and every release in releases.py know the same nine. Restricted: what changes the
# server or reads beyond the models it serves: model-repository (index, load, unload),
# shared-memory (registering regions: Triton's August 2025 security bulletin), logging and trace
# (settings, trace files). Open: inference (infer and generate: src/http_server.cc HandleGenerate
# checks the inference group), health (the kubelet's probes), metadata (what clients ask before
# a request), and two read-only ones that only repeat what is readable anyway: model-config (the
# config.pbtxt of the model repository ConfigMap; perf_analyzer and genai-perf read it before they
# send) and statistics (the counters of the metrics port, which Prometheus scrapes unrestricted).
RESTRICTED_APIS = ("model-repository", "shared-memory", "logging", "trace")
REDACTED = "<admin key>"


def restricted_api_args(key: str) -> list[str]:
    """The flags that restrict RESTRICTED_APIS on HTTP (header ADMIN_KEY_HEADER) and gRPC (metadata
    `triton-grpc-protocol-<ADMIN_KEY_HEADER>`) to requests carrying `key`. Triton reads the key
    from its command line only (src/command_line_parser.cc at r25.12 has no file or environment
    form), so it is in the process's argv, which /proc shows only inside the container: the launcher
    logs the command with the key replaced (`redacted`)."""
    setting = f"{','.join(RESTRICTED_APIS)}:{ADMIN_KEY_HEADER}={key}"
    return [f"--http-restricted-api={setting}", f"--grpc-restricted-protocol={setting}"]


def redacted(argv: list[str], key: str) -> list[str]:
    return [a.replace(key, REDACTED) for a in argv] if key else list(argv)


def rank_id(rank: int) -> str:
    """tritonserver --id of a rank: how the supervisor finds each rank among its descendants."""
    return f"rank{rank}"


def rank_args(c: PodConfig, rank: int) -> list[str]:
    """tritonserver for one rank. Leader mode: rank 0 serves HTTP, gRPC and metrics; the others
    only load tensorrt_llm and join rank 0's MPI world, so only rank 0 restricts the admin APIs."""
    args = [
        c.tritonserver,
        f"--id={rank_id(rank)}",
        f"--model-repository={c.model_repo}",
        # The llmapi model sets max_batch_size and decoupled from model.yaml's triton_config in its
        # auto_complete_config (upstream's config.pbtxt leaves both out); the other backends'
        # configs are complete as rendered.
        *([] if c.backend == "pytorch" else ["--disable-auto-complete-config"]),
        f"--exit-timeout-secs={c.exit_timeout}",
        # Python-backend stubs of co-located ranks must not share shared-memory regions.
        f"--backend-config=python,shm-region-prefix-name={rank_id(rank)}_",
    ]
    if c.backend_dir:
        args.append(f"--backend-directory={c.backend_dir}")
    if rank == 0:
        return [*args, f"--http-port={c.http_port}", f"--grpc-port={c.grpc_port}",
                f"--metrics-port={c.metrics_port}", "--allow-metrics=true", "--metrics-interval-ms=1000",
                *METRICS_CONFIG, *restricted_api_args(c.admin_key),
                f"--allow-gpu-metrics={str(c.backend != 'cpu-reference').lower()}"]  # fmt: skip
    return [*args, "--allow-http=false", "--allow-grpc=false", "--allow-metrics=false",
            "--model-control-mode=explicit", "--load-model=tensorrt_llm"]  # fmt: skip


def worker_hosts(c: PodConfig) -> list[str]:
    return [c.worker_host_pattern.format(group=c.group, worker=w) for w in range(1, c.pods_per_replica)]


def rank_places(c: PodConfig, leader: str) -> tuple[str, ...]:
    """The pod of each rank of a leader's world, by rank (serve_command's host order): the leader
    (`leader`, its own name) first."""
    hosts = [leader, *(worker_hosts(c) if c.multi_node else [])]
    per_pod = c.ranks_per_pod if c.multi_node else c.world_size
    return tuple(host for host in hosts for _ in range(per_pod))


def launch_agent(c: PodConfig) -> list[str]:
    """The launch agent (runtime/launch_agent.py), run by this pod's Python: a worker serves it,
    a leader's mpirun calls it in ssh's place."""
    return [c.python, "-m", "llm_operator.runtime.launch_agent"]


def serve_command(c: PodConfig) -> list[str]:
    """What a leader (or single) pod runs: one tritonserver for a world of one, else ONE mpirun
    launching every rank, so all of them form a single MPI world of tp*pp."""
    mpirun = [c.mpirun, "--allow-run-as-root", "--bind-to", "none", "--map-by", "slot"]
    if c.llmapi_shape and not c.multi_node:
        # One tritonserver, as upstream's launch_triton_server.py starts the llmapi model (mpirun
        # -n 1, TensorRT-LLM v1.1.0 triton_backend/scripts): the LLM API spawns its tp*pp workers
        # through MPI itself. Not bound: Open MPI would pin a world of one to a single core.
        return [*mpirun, "-n", "1", *rank_args(c, 0)]
    if c.world_size == 1:
        return rank_args(c, 0)
    # Slots fill in host order: localhost takes ranks 0..g-1, worker k ranks k*g..(k+1)*g-1.
    hosts = [f"localhost:{c.ranks_per_pod if c.multi_node else c.world_size}"]
    if c.multi_node:
        hosts += [f"{h}:{c.ranks_per_pod}" for h in worker_hosts(c)]
        mpirun += across_pods(c)
    command = [*mpirun, "--host", ",".join(hosts)]
    if c.llmapi_shape:
        # Upstream's multi-node llmapi launch (tensorrtllm_backend docs/llmapi.md: `srun ...
        # trtllm-llmapi-launch tritonserver`; Dynamo's operator: mpirun over SSH): every rank runs
        # the same line, and trtllm-llmapi-launch makes rank 0 the tritonserver (with the LLM API's
        # MPI session server beside it) and every other rank an MPI worker of that session
        # (tensorrt_llm.llmapi.mgmn_worker_node). docs/launcher-and-engines.md. The cpu-reference
        # runtime's launcher does the same with its pipeline stages (cpu_reference/launch.py).
        return [*command, "-n", str(c.world_size), c.llmapi_launch, *rank_args(c, 0)]
    for rank in range(c.world_size):
        command += [*([":"] if rank else []), "-n", "1", *rank_args(c, rank)]
    return command


def across_pods(c: PodConfig) -> list[str]:
    """mpirun's settings for a world spanning the pods of a group, whatever runs in it."""
    return [
        # The worker's shell may not have orted on its PATH; Open MPI prepends PREFIX/bin and PREFIX/lib.
        "--prefix", str(Path(c.mpirun).parent.parent),
        # Workers' daemons start through their launch agent (NVIDIA's image has no sshd). Open MPI
        # splits the value at spaces into the agent's argv and looks its first word up on PATH.
        "--mca", "plm_rsh_agent", " ".join(launch_agent(c)),
        # Only the leader holds the leader's identity: no orted-to-orted tree spawn.
        "--mca", "plm_rsh_no_tree_spawn", "1",
        # A world that aborts (a rank or a daemon lost) is killed at once: Open MPI 4.1 otherwise
        # sends SIGCONT, sleeps this long, SIGTERM, sleeps again, then SIGKILL, on mpirun and on every
        # orted (orte/mca/odls/base/odls_base_default_fns.c kill_local_procs), 2 s of every group
        # recovery. Nothing of a broken world is worth a graceful end; a pod's stop still drains rank
        # 0 first and signals the ranks itself (supervisor.py).
        "--mca", "odls_base_sigkill_timeout", "0",
        # Pod names resolve only as FQDNs through the headless Service.
        "--mca", "orte_keep_fqdn_hostnames", "1",
        # Open MPI's own point-to-point layer (TCP between pods, shared memory within one), not
        # HPC-X's default UCX: the pods get no RDMA devices. Dynamo's operator forces the same for
        # its mpirun across pods (ai-dynamo/dynamo deploy/cloud/operator/internal/dynamo/
        # backend_trtllm.go at 396bbf11). MPI carries requests between ranks; tensors go by NCCL.
        "--mca", "pml", "ob1",
    ]  # fmt: skip


def worker_command(c: PodConfig) -> list[str]:
    """A worker pod serves the launch agent: its ranks are started by the leader's mpirun (through
    orted)."""
    return [*launch_agent(c), "--serve"]


def engine_problems(c: PodConfig) -> list[str]:
    """An engine built for another world than this pod's, before Triton fails on it with a less
    helpful message (worldConfig rejects an MPI size that is not the engine's tp*pp). Missing
    files are preflight.py's."""
    config = Path(c.engine_dir) / "config.json"
    try:
        mapping = json.loads(config.read_text()).get("pretrained_config", {}).get("mapping", {})
    except (OSError, ValueError, AttributeError) as e:
        return [f"{config} is unreadable: {e}"]
    return [
        f"the engine was built with {key}={mapping[key]}, this pod runs {want}"
        for key, want in (("tp_size", c.tp), ("pp_size", c.pp))
        if key in mapping and mapping[key] != want
    ]
