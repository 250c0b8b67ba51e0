"""The test world's model stores (e2e/cluster/artifacts.py) on 127.0.0.1, for tests of the fetcher
alone: the same versitygw and olah binaries, data and seeding as `up` gives the cluster, without
the cluster. And the fetcher run as the fetch Job runs it: a program, its result in the
termination-message file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.cluster import artifacts
from e2e.cluster.components import run_build_tools
from e2e.cluster.processes import free_ports
from e2e.cluster.readiness import http_ok

REPO = Path(__file__).resolve().parents[2]


@contextmanager
def local_stores(root: Path) -> Iterator[artifacts.Stores]:
    """versitygw and olah on free 127.0.0.1 ports, seeded; stopped on exit."""
    tools, _ = run_build_tools(lambda _: None, groups=("stores",))
    s3_port, hf_port = free_ports(2)
    stores = artifacts.prepare(root, "127.0.0.1", s3_port, hf_port, root / "olah.log", root / "cache")
    argv, env = artifacts.versitygw_command(tools["versitygw"], stores)
    with (root / "versitygw.log").open("wb") as s3_out, Path(stores.hf_log).open("wb") as hf_out:
        procs = [
            subprocess.Popen(argv, env=env, stdout=s3_out, stderr=subprocess.STDOUT),
            subprocess.Popen(
                artifacts.olah_command(tools["olah-cli"], stores),
                stdout=hf_out,
                stderr=subprocess.STDOUT,
                cwd=root,
            ),
        ]
    try:
        deadline = time.monotonic() + 60
        while not artifacts.ready(http_ok, stores):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"the stores did not start; see {root}/versitygw.log and {stores.hf_log}")
            time.sleep(0.2)
        artifacts.seed_s3(stores, artifacts.checkpoints(artifacts.checkpoint_cache(root / "cache")))
        yield stores
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=20)


@dataclass
class Fetched:
    code: int
    result: dict[str, Any]
    stdout: str
    stderr: str


class Fetcher:
    """`python3 -m llm_operator.modelcache.fetch` into one cache root."""

    def __init__(self, cache_root: Path) -> None:
        self.cache_root = cache_root
        self.log = cache_root.parent / f"{cache_root.name}-termination-log"

    def command(self, uri: str, key: str, *args: str) -> list[str]:
        return [sys.executable, "-m", "llm_operator.modelcache.fetch", "--uri", uri, "--source-key", key,
                "--cache-root", str(self.cache_root), "--termination-log", str(self.log), *args]  # fmt: skip

    def env(self, credentials: Mapping[str, str]) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "HF_"))}
        path = os.pathsep.join([str(REPO / "operator"), keep.get("PYTHONPATH", "")])
        return {**keep, **credentials, "PYTHONPATH": path, "HF_HUB_DISABLE_TELEMETRY": "1"}

    def __call__(self, uri: str, key: str, *args: str, credentials: Mapping[str, str] = {}) -> Fetched:
        self.log.unlink(missing_ok=True)
        done = subprocess.run(
            self.command(uri, key, *args),
            env=self.env(credentials),
            capture_output=True,
            text=True,
            timeout=120,
        )
        return Fetched(done.returncode, json.loads(self.log.read_text()), done.stdout, done.stderr)

    def start(
        self, uri: str, key: str, *args: str, credentials: Mapping[str, str] = {}
    ) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.command(uri, key, *args), env=self.env(credentials), stdout=subprocess.PIPE, text=True
        )


def s3_gets(stores: artifacts.Stores, key: str) -> int:
    """GetObject requests for `key` in versitygw's access log (`... s3_GetObject <key> ...`)."""
    lines = stores.s3_log.read_text().splitlines() if stores.s3_log.exists() else []
    return sum(1 for line in lines if f" s3_GetObject {key} " in line)


def hub_gets(stores: artifacts.Stores, path: str) -> int:
    """GET requests of files named `path` in olah's (uvicorn's) access log."""
    lines = Path(stores.hf_log).read_text().splitlines()
    return sum(1 for line in lines if '"GET /' in line and "/resolve/" in line and f"/{path} HTTP" in line)
