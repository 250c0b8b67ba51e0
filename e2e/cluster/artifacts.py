"""The test world's model stores (docs/development.md, "Model stores"): a real S3 server and a real
Hugging Face mirror, started by `up` inside the cluster's network namespace on NODE_IP, each with
an access log the tests read (proof that a cached model is not downloaded twice).

- S3: versitygw (build-tools.sh, from Go modules), posix backend under the state directory, root
  keys generated at each `up` (stores.json; passed in its environment, never on a command line).
  Bucket `models`: `tiny-llama/` (the cpu-reference checkpoint of seed 0) and `tiny-llama-v2/`
  (seed 1), uploaded with boto3; `model.safetensors` of `tiny-llama/` as a multipart upload, so
  both kinds of ETag are served.
- Hugging Face mirror: olah (scripts/ensure-tool-venv.sh hf-mirror), offline, serving the git
  repository `models/llm-operator/tiny-llama` of its mirrors path: tag `v1` = seed 0, branch
  `main` = seed 1, `model.safetensors` a Git LFS pointer whose object is written by hand where
  olah 0.5.4 reads it (`<work tree>/.git/lfs/objects/<2>/<2>/<oid>`, olah/mirror/repos.py).

The same functions start both on 127.0.0.1 for tests of the fetcher alone (tests/e2e/stores.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from e2e.cluster import netns
from e2e.cluster.pki import write_private
from e2e.cluster.processes import Children
from e2e.cluster.state import StateDir

REPO = Path(__file__).resolve().parents[2]
S3_PORT, HF_PORT = 7070, 8090
REGION = "us-east-1"
BUCKET = "models"
S3_MODELS = {"tiny-llama": 0, "tiny-llama-v2": 1}  # prefix -> checkpoint seed
HF_REPO = "llm-operator/tiny-llama"
HF_REVISIONS = (("v1", 0), ("main", 1))  # tag v1 (seed 0), then branch main moves on to seed 1
LFS = (".safetensors",)
MULTIPART = ("tiny-llama/model.safetensors",)
BINARIES = ("versitygw", "olah-cli")
# As `down` finds them in /proc (processes.owned_by): olah runs as `python3.11 .../olah-cli`.
COMPONENTS = ("versitygw", "olah-cli")
HEALTH = "/health"
# Fixed dates make the mirror's commits, hence its revisions, the same at every `up`.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "llm-operator test world", "GIT_AUTHOR_EMAIL": "e2e@llm-operator.invalid",
    "GIT_COMMITTER_NAME": "llm-operator test world", "GIT_COMMITTER_EMAIL": "e2e@llm-operator.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
    "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1",
}  # fmt: skip


@dataclass(frozen=True)
class Stores:
    """Where the stores listen and what a test needs to use them (stores.json in `root`)."""

    root: str
    host: str
    s3_port: int
    hf_port: int
    access_key: str
    secret_key: str
    hf_log: str  # olah's output: uvicorn's access log, one line per request

    @property
    def s3_endpoint(self) -> str:
        return f"http://{self.host}:{self.s3_port}"

    @property
    def hf_endpoint(self) -> str:
        return f"http://{self.host}:{self.hf_port}"

    @property
    def s3_log(self) -> Path:
        return Path(self.root) / "s3-access.log"

    @property
    def s3_data(self) -> Path:
        return Path(self.root) / "s3"

    @property
    def mirrors(self) -> Path:
        return Path(self.root) / "hf-mirrors"

    @property
    def credentials(self) -> dict[str, str]:
        """As the fetch pod's environment has them (the Secret's keys)."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}


def new(root: Path, host: str, s3_port: int, hf_port: int, hf_log: Path) -> Stores:
    root.mkdir(parents=True, exist_ok=True)
    stores = Stores(
        str(root), host, s3_port, hf_port, "e2e" + secrets.token_hex(8), secrets.token_hex(20), str(hf_log)
    )
    write_private(root / "stores.json", json.dumps(asdict(stores), indent=1))
    return stores


def load(root: Path) -> Stores:
    return Stores(**json.loads((root / "stores.json").read_text()))


def checkpoints(dest: Path) -> dict[int, Path]:
    """The cpu-reference checkpoints of every seed the stores serve (engineer C's writer)."""
    from llm_operator.runtime.cpu_reference import checkpoint

    out = {}
    for seed in sorted({*S3_MODELS.values(), *(s for _, s in HF_REVISIONS)}):
        out[seed] = dest / f"seed-{seed}"
        if not (out[seed] / "model.safetensors").is_file():
            checkpoint.write(out[seed], seed=seed)
    return out


# S3 ------------------------------------------------------------------------------------------------


def versitygw_command(binary: Path, stores: Stores) -> tuple[list[str], dict[str, str]]:
    stores.s3_data.mkdir(parents=True, exist_ok=True)
    argv = [str(binary), "--port", f"{stores.host}:{stores.s3_port}", "--region", REGION,
            "--access-log", str(stores.s3_log), "--health", HEALTH, "posix", str(stores.s3_data)]  # fmt: skip
    env = {**os.environ, "ROOT_ACCESS_KEY_ID": stores.access_key, "ROOT_SECRET_ACCESS_KEY": stores.secret_key}
    return argv, env


def s3_client(stores: Stores, **credentials: str) -> Any:
    import boto3
    from botocore.config import Config

    keys = credentials or {"aws_access_key_id": stores.access_key, "aws_secret_access_key": stores.secret_key}
    config = Config(region_name=REGION, s3={"addressing_style": "path"}, retries={"max_attempts": 2})
    return boto3.client("s3", endpoint_url=stores.s3_endpoint, config=config, **keys)


def seed_s3(stores: Stores, seeds: dict[int, Path]) -> None:
    """Bucket `models` with one prefix per S3_MODELS entry (idempotent)."""
    from boto3.s3.transfer import TransferConfig

    client = s3_client(stores)
    if BUCKET not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket=BUCKET)
    single = TransferConfig(multipart_threshold=1 << 40)
    multipart = TransferConfig(multipart_threshold=1, multipart_chunksize=5 << 20)
    for prefix, seed in S3_MODELS.items():
        for path in sorted(seeds[seed].iterdir()):
            key = f"{prefix}/{path.name}"
            client.upload_file(str(path), BUCKET, key, Config=multipart if key in MULTIPART else single)


# Hugging Face mirror -----------------------------------------------------------------------------


def lfs_pointer(data: bytes) -> bytes:
    """A Git LFS pointer file (git-lfs spec v1) for `data`."""
    oid = hashlib.sha256(data).hexdigest()
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {len(data)}\n".encode()


def hf_repository(stores: Stores, seeds: dict[int, Path]) -> Path:
    """The mirror's git repository, one commit per HF_REVISIONS entry (its tag or branch)."""
    work = stores.mirrors / "models" / HF_REPO
    if work.exists():
        subprocess.run(["rm", "-rf", str(work)], check=True)
    work.mkdir(parents=True)

    def git(*args: str) -> None:
        subprocess.run(
            ["git", "-C", str(work), *args], check=True, capture_output=True, env={**os.environ, **GIT_ENV}
        )

    git("init", "-q", "-b", "main")
    (work / ".gitattributes").write_text("".join(f"*{s} filter=lfs diff=lfs merge=lfs -text\n" for s in LFS))
    for revision, seed in HF_REVISIONS:
        for path in sorted(seeds[seed].iterdir()):
            data = path.read_bytes()
            if path.suffix in LFS:
                oid = hashlib.sha256(data).hexdigest()
                obj = work / ".git/lfs/objects" / oid[:2] / oid[2:4] / oid
                obj.parent.mkdir(parents=True, exist_ok=True)
                obj.write_bytes(data)
                data = lfs_pointer(data)
            (work / path.name).write_bytes(data)
        git("add", "-A")
        git("commit", "-q", "-m", f"tiny-llama, cpu-reference checkpoint of seed {seed}")
        if revision != "main":
            git("tag", revision)
    return work


def olah_command(binary: Path, stores: Stores) -> list[str]:
    """olah-cli with a config file: offline (never asks huggingface.co), the mirrors path only."""
    config = Path(stores.root) / "olah.toml"
    config.write_text(
        "[basic]\n"
        f'host = "{stores.host}"\nport = {stores.hf_port}\n'
        f'repos-path = "{Path(stores.root) / "hf-cache"}"\n'
        f'mirror-netloc = "{stores.host}:{stores.hf_port}"\n'
        f'mirror-lfs-netloc = "{stores.host}:{stores.hf_port}"\n'
        f'mirrors-path = ["{stores.mirrors}"]\n'
        "[accessibility]\noffline = true\n"
    )
    return [
        str(binary.parent / "olah-cli"),
        "-c",
        str(config),
        "--log-path",
        str(Path(stores.root) / "olah-logs"),
    ]


def prepare(root: Path, host: str, s3_port: int, hf_port: int, hf_log: Path, cache: Path) -> Stores:
    """Keys, directories, checkpoints (cached in `cache` by the writer's source) and the mirror's
    repository: everything but the S3 objects, which need the server up."""
    stores = new(root, host, s3_port, hf_port, hf_log)
    seeds = checkpoints(checkpoint_cache(cache))
    hf_repository(stores, seeds)
    return stores


def checkpoint_cache(cache: Path) -> Path:
    """Where the checkpoints are kept under `cache`: keyed by the writer's package source."""
    package = REPO / "operator/llm_operator/runtime/cpu_reference"
    h = hashlib.sha256()
    for path in sorted(package.glob("*.py")):
        h.update(path.read_bytes())
    return cache / f"checkpoints-{h.hexdigest()[:12]}"


def ready(url_ok: Callable[[str], bool], stores: Stores) -> bool:
    # olah's offline mirror answers a repository's info only at a revision (the bare
    # /api/models/ORG/NAME asks huggingface.co for the latest commit: 401 offline).
    return url_ok(f"{stores.s3_endpoint}{HEALTH}") and url_ok(
        f"{stores.hf_endpoint}/api/models/{HF_REPO}/revision/main"
    )


def start(state: StateDir, tools: Mapping[str, Path], children: Children) -> Stores:
    """versitygw and olah in the cluster's namespace on NODE_IP, their data under the state
    directory, the checkpoints cached in the node cache."""
    stores = prepare(
        state.root / "stores", netns.NODE_IP, S3_PORT, HF_PORT, state.log_file("olah-cli"), state.node_cache
    )
    argv, env = versitygw_command(tools["versitygw"], stores)
    commands = {"versitygw": (argv, env), "olah-cli": (olah_command(tools["olah-cli"], stores), None)}
    for name, (command, environ) in commands.items():
        pid = children.spawn(
            name, netns.command(state.netns, command), state.log_file(name), state.root, environ
        )
        state.write_pid(name, pid)
    return stores


def seed_in(ns: str, stores: Stores, cache: Path) -> None:
    """The S3 objects, uploaded from a thread that entered namespace `ns` (boto3's sockets are
    made in the thread that sends)."""
    failed: list[BaseException] = []

    def upload() -> None:
        try:
            netns.setns(ns)
            seed_s3(stores, checkpoints(checkpoint_cache(cache)))
        except BaseException as e:  # handed to the caller
            failed.append(e)

    thread = threading.Thread(target=upload, daemon=True)
    thread.start()
    thread.join()
    if failed:
        raise RuntimeError(f"uploading the models to the S3 server failed: {failed[0]}")
