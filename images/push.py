"""Push OCI image archives (images.builder's, or any one-image OCI layout tar) to a registry with
crane, skipping every name the registry already has at the archive's digest.

`python -m images.push --registry HOST/PATH [--version V] [NAME...]` pushes images.builder's
images (all by default) as `HOST/PATH/<name>:<version>` (default: the project's version, which the
chart's appVersion and the operator's default image names carry), the launcher as
`HOST/PATH/launcher:<content hash>`, the name the operator runs it by (llm_operator/inject.py).
Without --registry it pushes to the running test world's registry (e2e/cluster/registry.py), under
every name its node pulls.
crane reads credentials from `$DOCKER_CONFIG/config.json` (`crane auth login`, `docker login`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CRANE_VERSION = "v0.22.1"  # build-tools.sh builds it

Wrap = Callable[[list[str]], list[str]]


def project_version() -> str:
    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


def manifest_digest(archive: Path) -> str:
    """The digest of the one image manifest an OCI archive holds (under any number of names)."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        assert member is not None
        index = json.load(member)
    digests: set[str] = {m["digest"] for m in index.get("manifests", [])}
    if len(digests) != 1:
        raise ValueError(f"{archive} holds {len(digests)} manifests; push one image per archive")
    return digests.pop()


def repository(ref: str) -> str:
    """`host/path/name:tag` -> `host/path/name` (a host's port is not a tag)."""
    name, _, tag = ref.rpartition(":")
    return name if name and "/" not in tag else ref


class Crane:
    """crane at `binary`, with `env` added (credentials, CA) and each command line through `wrap`
    (the test world runs it inside the cluster's network namespace)."""

    def __init__(self, binary: Path, env: Mapping[str, str] | None = None, wrap: Wrap | None = None) -> None:
        self.binary = binary
        self.env = {**os.environ, **(env or {})}
        self.wrap = wrap or (lambda argv: argv)

    def run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.wrap([str(self.binary), *args]),
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
        )

    def check(self, *args: str) -> str:
        proc = self.run(*args)
        if proc.returncode != 0:
            raise RuntimeError(f"crane {args[0]} {args[-1]}: {(proc.stderr or proc.stdout).strip()}")
        return proc.stdout.strip()

    def digest(self, ref: str) -> str | None:
        """The manifest digest the registry has under `ref`, None when it has none (or refuses)."""
        proc = self.run("digest", ref, timeout=60)
        return proc.stdout.strip() if proc.returncode == 0 else None


def push(crane: Crane, archive: Path, refs: Sequence[str], log: Callable[[str], None]) -> list[str]:
    """Push `archive` under every name of `refs` the registry lacks at its digest; returns those.
    Blobs the registry has are not sent again (crane asks first): a rebuilt image whose base
    layer is unchanged uploads only the layers above it."""
    digest = manifest_digest(archive)
    with ThreadPoolExecutor(8) as pool:
        have = dict(zip(refs, pool.map(crane.digest, refs), strict=True))
    missing = [ref for ref in refs if have[ref] != digest]
    if not missing:
        return []
    start = time.monotonic()
    with tempfile.TemporaryDirectory(dir=archive.parent, prefix=".push-") as tmp:
        layout = Path(tmp)
        with tarfile.open(archive) as tar:
            tar.extractall(layout, filter="data")
        # crane pushes a layout of one entry; the archive names its manifest once per name.
        index = json.loads((layout / "index.json").read_text())
        index["manifests"] = index["manifests"][:1]
        (layout / "index.json").write_text(json.dumps(index))
        pushed: dict[str, str] = {}  # repository -> the first ref pushed there
        for ref in missing:
            repo = repository(ref)
            if repo in pushed:
                crane.check("tag", pushed[repo], ref.rpartition(":")[2])
            else:
                crane.check("push", str(layout), ref)
                pushed[repo] = ref
    log(f"pushed {archive.name} as {', '.join(missing)} in {time.monotonic() - start:.1f} s")
    return missing


def published_tag(name: str, version: str) -> str:
    """The tag image `name` is published under: `version`, or the tag its spec names from its
    content (the launcher's: the hash of the files it copies, which the operator names it by)."""
    from images.builder.images import SPECS

    spec = SPECS[name]
    return spec.tag() if spec.tag is not None else version


def find_crane() -> Path:
    """crane on PATH, else the one build-tools.sh built (`make images`, `make tools`)."""
    if found := shutil.which("crane"):
        return Path(found)
    cache = Path(os.environ.get("LLMOP_CACHE", Path.home() / ".cache" / "llm-operator"))
    built = sorted((cache / "bin").glob(f"crane-{CRANE_VERSION}-*/crane"))
    if not built:
        raise FileNotFoundError("no crane: run `e2e/cluster/build-tools.sh crane` (`make images` does)")
    return built[-1]


def main(argv: list[str] | None = None) -> int:
    from images.builder.images import SPECS, build

    parser = argparse.ArgumentParser(prog="python -m images.push", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"images to push: {', '.join(SPECS)}")
    parser.add_argument(
        "--registry", default="", help="HOST/PATH the images go under (default: the test world's)"
    )
    parser.add_argument("--version", default=project_version(), help="tag (default: the project's version)")
    args = parser.parse_args(argv)
    names = args.names or list(SPECS)
    if unknown := [n for n in names if n not in SPECS]:
        parser.error(f"unknown images {unknown}; known: {', '.join(SPECS)}")
    quiet: Callable[[str], None] = lambda line: None  # noqa: E731
    archives = [build(name, log=quiet) for name in names]
    try:
        if not args.registry:
            from e2e.cluster.launcher import Cluster, ClusterError

            try:
                pushed = Cluster().push_images(archives, version=args.version)
            except ClusterError as e:
                raise RuntimeError(f"{e} (or name one: REGISTRY=host/path)") from None
            print("\n".join(pushed) if pushed else "the test world's registry has every image already")
            return 0
        crane = Crane(find_crane())
        for name, archive in zip(names, archives, strict=True):
            tag = published_tag(name, args.version)
            for ref in push(crane, archive, [f"{args.registry.rstrip('/')}/{name}:{tag}"], print):
                print(ref)
    except (RuntimeError, OSError, ValueError) as e:
        print(f"images.push: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
