"""`trtllm-llmapi-launch` of the cpu-reference runtime: what every rank of a multi-node group runs
under the leader's mpirun, in the pytorch backend's launch shape (runtime/commands.py
serve_command): rank 0 becomes the command it is given (tritonserver, whose llmapi model is the
pipeline's first stage: llmapi.py), every other rank a later stage of the same model
(pipeline.serve_stage).

As upstream's script (NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/trtllm-llmapi-launch at 020c89e6):
the rank is SLURM_PROCID, else OMPI_COMM_WORLD_RANK, PMI_RANK, PMI_ID, else 0; the world's size
SLURM_NTASKS, else OMPI_COMM_WORLD_SIZE, else 1; rank 0 runs its command with the MPI variables
(those prefixes) removed, so that the server is no MPI process of its own. Upstream's rank 0 also
runs an MPI session server for its workers (tensorrt_llm.llmapi.mgmn_leader_node); here the stages
meet over gloo instead (pipeline.py), so rank 0 execs its command and tells it the world's size.

    python -m llm_operator.runtime.cpu_reference.launch COMMAND [ARG...]
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

# Where the cpu-runtime image installs script() (its LLMOP_LLMAPI_LAUNCH): mpirun starts a program.
SCRIPT = "/usr/local/bin/llm-operator-cpu-llmapi-launch"
MPI_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "SLURM_", "MPI_", "UCX_", "I_MPI_", "HYDRA_", "KMP_", "MPICH_",
                "MV2_", "CRAY_")  # fmt: skip
RANK_VARIABLES = ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMI_ID")
SIZE_VARIABLES = ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")


def script(python: str, python_path: str) -> str:
    """The launcher as a program: `python` on this module, its package found on `python_path`."""
    path = f"{python_path}${{PYTHONPATH:+:$PYTHONPATH}}"
    return f'#!/bin/sh\nPYTHONPATH={path} exec {python} -m llm_operator.runtime.cpu_reference.launch "$@"\n'


def _first(environ: Mapping[str, str], names: Sequence[str], default: int) -> int:
    return next((int(environ[n]) for n in names if environ.get(n)), default)


def mpi_rank(environ: Mapping[str, str]) -> int:
    return _first(environ, RANK_VARIABLES, 0)


def mpi_world_size(environ: Mapping[str, str]) -> int:
    return _first(environ, SIZE_VARIABLES, 1)


def server_environment(environ: Mapping[str, str]) -> dict[str, str]:
    from llm_operator.runtime.cpu_reference.pipeline import WORLD_ENV

    kept = {k: v for k, v in environ.items() if not k.startswith(MPI_PREFIXES)}
    return {**kept, WORLD_ENV: str(mpi_world_size(environ))}


def run_stage(rank: int, environ: Mapping[str, str]) -> None:
    import torch

    from llm_operator.runtime.cpu_reference import pipeline, served

    torch.set_num_threads(1)  # as rank 0's model: the same arithmetic, the same answers
    link = pipeline.Link(rank, mpi_world_size(environ), pipeline.leader_host(environ), pipeline.port(environ))
    identity = link.share({})
    lm, _ = served.load(identity["model"], int(identity["weights_seed"]), identity["model_dir"])
    layers = pipeline.stage_layers(len(lm.layers), rank, link.world)
    print(f"pipeline stage {rank} of {link.world}: layers {layers}", file=sys.stderr, flush=True)
    pipeline.serve_stage(lm, link)


def install() -> None:
    """Write script() to SCRIPT for the package this module is in (the cpu-runtime image's build)."""
    with open(SCRIPT, "w") as out:
        out.write(script("python3", str(Path(__file__).resolve().parents[3])))
    os.chmod(SCRIPT, 0o755)


def main(argv: Sequence[str]) -> int:
    if not argv:
        print("usage: python -m llm_operator.runtime.cpu_reference.launch COMMAND [ARG...] | --install",
              file=sys.stderr)  # fmt: skip
        return 64
    if list(argv) == ["--install"]:
        install()
        return 0
    rank = mpi_rank(os.environ)
    if rank == 0:
        os.execvpe(argv[0], list(argv), server_environment(os.environ))
    run_stage(rank, os.environ)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
