"""The images the operator runs its children with (the Helm chart sets them; controller/config.py
reads them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Images:
    runtime: str
    cpu_runtime: str
    engine_builder: str
    trtllm_version: str
