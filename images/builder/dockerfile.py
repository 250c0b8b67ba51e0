"""The runtime half of a Dockerfile (ENV, LABEL, USER, WORKDIR, ENTRYPOINT, CMD), read so the
locally built image runs exactly as the published one does; its RUN/COPY steps are what
images.builder.images re-does from Debian packages and PyPI."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from pathlib import Path

from images.builder.oci import ImageConfig

# What the python:3.11-slim base sets and our rootfs needs too (Debian's python3 reads LANG).
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a single-stage Dockerfile, continuations joined, comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def _pairs(arguments: str) -> dict[str, str]:
    return dict(word.split("=", 1) for word in shlex.split(arguments))


def runtime_config(dockerfile: Path, paths: Mapping[str, str] | None = None) -> ImageConfig:
    """The image config the Dockerfile produces; `paths` rewrites its base image's install paths
    (old -> new prefix) in ENV values to where the local rootfs has them."""
    env, labels = dict(BASE_ENV), {}
    entrypoint: list[str] = []
    cmd: list[str] = []
    user, workdir = "", "/"
    for op, arguments in instructions(dockerfile):
        if op == "ENV":
            env.update(_pairs(arguments))
        elif op == "LABEL":
            labels.update(_pairs(arguments))
        elif op == "USER":
            user = arguments
        elif op == "WORKDIR":
            workdir = arguments
        elif op in ("ENTRYPOINT", "CMD"):
            if not arguments.startswith("["):
                raise ValueError(f"{dockerfile.name}: {op} must be in exec form")
            entrypoint, cmd = (
                (json.loads(arguments), []) if op == "ENTRYPOINT" else (entrypoint, json.loads(arguments))
            )
    for old, new in (paths or {}).items():
        env = {k: v.replace(old, new) for k, v in env.items()}
    return ImageConfig(entrypoint=entrypoint, cmd=cmd, env=env, user=user, workdir=workdir, labels=labels)
