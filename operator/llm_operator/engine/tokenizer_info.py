"""The build's last step before its marker: xgrammar's view of the checkpoint's tokenizer beside the
engine (contract.XGRAMMAR_TOKENIZER_INFO), which the C++ backend's guided decoder loads.

Upstream's script writes the file into a scratch directory inside the staged engine; it moves into
the engine only when the script exited 0 in time and the file holds what the backend reads
(contract.tokenizer_info_problem, the launcher's and the front door's check too). Anything else
(a script that died halfway through its write, hung, or ran out of disk) leaves no file: the
engine is cached under a key that does not change, so a torn file would fail the model's load in
every pod that serves it, while an engine without one serves unguided. Injected with build.py
(llm_operator/inject.py): standard library and llm_operator.contract only.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from llm_operator.contract import XGRAMMAR_TOKENIZER_INFO, tokenizer_info_problem

# Writes <--output_dir>/xgrammar_tokenizer_info.json from AutoTokenizer.from_pretrained(--model_dir)
# (NVIDIA/TensorRT-LLM examples/generate_xgrammar_tokenizer_info.py, stored copy 7ed07f06):
# triton-inference-server/tensorrtllm_backend docs/guided_decoding.md runs it from examples/ on
# every release branch r25.07 to r26.07 (5419275 r25.12, 3bc1153 r26.07), whose images copy
# examples/ to /app/examples.
SCRIPT = "generate_xgrammar_tokenizer_info.py"
SCRATCH = ".xgrammar-tokenizer-info"  # the script's --output_dir, inside the staged engine
# The script loads a tokenizer and lists its vocabulary (not timed here); past this it is taken as
# hung (a filesystem that stopped answering) and the build goes on without it, not hanging the Job.
TIMEOUT_SECONDS = 600


def command(python: str, script: str | Path, model_dir: str, engine: str) -> list[str]:
    """Upstream's script on the checkpoint's tokenizer (the engine's vocabulary), into SCRATCH."""
    return [python, str(script), "--model_dir", model_dir, "--output_dir", f"{engine}/{SCRATCH}"]


def skipped(why: str) -> None:
    why = f"engine build: no xgrammar tokenizer info ({why}): this engine serves without guided decoding"
    print(f"{why} (response_format, tool_choice required or named)", file=sys.stderr, flush=True)


def write(cmd: list[str], engine: Path, env: Mapping[str, str]) -> None:
    """Run command() `cmd` and move the file into `engine` if the guided decoder can load it. A
    failure is printed and leaves no file: it costs guided decoding, not the finished engine."""
    scratch, target = engine / SCRATCH, engine / XGRAMMAR_TOKENIZER_INFO
    print("+", shlex.join([*(f"{k}={v}" for k, v in env.items()), *cmd]), flush=True)
    try:
        target.unlink(missing_ok=True)
        shutil.rmtree(scratch, ignore_errors=True)
        subprocess.run(cmd, check=True, env={**os.environ, **env}, timeout=TIMEOUT_SECONDS)
        problem = tokenizer_info_problem(scratch / XGRAMMAR_TOKENIZER_INFO)
        if problem:
            skipped(f"the script wrote nothing the guided decoder can load: {problem}")
        else:
            os.replace(scratch / XGRAMMAR_TOKENIZER_INFO, target)  # one filesystem: all or nothing
    except subprocess.TimeoutExpired:
        skipped(f"{SCRIPT} did not finish in {TIMEOUT_SECONDS}s")
    except subprocess.CalledProcessError as e:
        skipped(f"{SCRIPT} exited {e.returncode}")
    except OSError as e:
        skipped(f"{type(e).__name__}: {e}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
