"""The start-up caches a pod shares with the pods before and after it (render/startup_cache.py): before
Triton starts, drop an autotuner cache file that does not parse.

TensorRT-LLM writes its autotuner cache in place (open, write) at the end of its warm-up, and its
load raises on a file it cannot read (NVIDIA/TensorRT-LLM tensorrt_llm/_torch/autotuner.py,
AutoTunerProfilingCache.save_cache / load_cache): two pods of one cache key warming up together can
leave a file cut short, which would then fail the start of every later pod. Dropped, it is tuned
and written again. Standard library only (runtime/).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from llm_operator.contract import AUTOTUNER_CACHE_ENV


def drop_unreadable(environ: Mapping[str, str]) -> list[str]:
    """Remove the autotuner's JSON files (the file the variable names, or one per rank beside it:
    <stem>.rank<N>.json) that are not JSON; what it did, one line each."""
    path = environ.get(AUTOTUNER_CACHE_ENV)
    if not path:
        return []
    target = Path(path)
    said = []
    for file in sorted(target.parent.glob(f"{target.stem}*.json")):
        try:
            json.loads(file.read_bytes())
        except ValueError:
            file.unlink(missing_ok=True)  # another pod's launcher may have dropped it first
            said.append(
                f"dropped the unreadable autotuner cache {file} (a write cut short): it is tuned again"
            )
        except OSError:
            continue  # gone meanwhile, or unreadable to us: upstream's load says so itself
    return said
