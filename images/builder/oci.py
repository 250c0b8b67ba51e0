"""OCI image-layout archives (image-spec v1.1), written and read here in plain Python.

No registry tool (skopeo, crane, buildah, docker) is available where this runs, and the format is
small: a tar of `oci-layout`, `index.json` and content-addressed `blobs/sha256/*` (gzip layers, a
config, a manifest). `ctr -n k8s.io images import` and `kind load image-archive` accept it.
Layers are deterministic: entries sorted, mtimes fixed, numeric ownership only, gzip header
without a timestamp.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from images.builder.cache import atomic_path

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
# containerd's exporter writes the full name under its own key and only the tag under the OCI one.
REF_NAME = "org.opencontainers.image.ref.name"
CONTAINERD_NAME = "io.containerd.image.name"
EPOCH = 0  # every mtime in a layer: the content hash, not the build time, says what changed
# Filled in by the container runtime, so never shipped (the directories themselves are).
RUNTIME_DIRS = ("dev", "proc", "sys", "run", "tmp")


@dataclass(frozen=True)
class ImageConfig:
    """What `docker inspect` shows under .Config: the runtime half of a Dockerfile."""

    entrypoint: list[str]
    cmd: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    user: str = ""
    workdir: str = "/"
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Layer:
    path: Path  # the gzip blob
    digest: str  # of the gzip blob: what the manifest names
    diff_id: str  # of the uncompressed tar: what the config names
    size: int


@dataclass(frozen=True)
class Image:
    path: Path
    refs: list[str]  # io.containerd.image.name of each index entry
    manifest: dict[str, Any]
    config: dict[str, Any]


class _Hashing(io.RawIOBase):
    """Write-through that hashes and counts what passes (one pass for digest and diff_id)."""

    def __init__(self, sink: io.BufferedIOBase) -> None:
        self.sink, self.sha, self.size = sink, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.sha.update(view)
        self.size += len(view)
        self.sink.write(view)
        return len(view)


def _entries(root: Path) -> Iterator[Path]:
    """Every path under root, parents before children, siblings sorted (the tar order)."""
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if here.parent == root and here.name in RUNTIME_DIRS:
            dirnames.clear()
            continue
        dirnames.sort()
        yield from (here / name for name in sorted([*dirnames, *filenames]))


def write_layer(
    root: Path, dest: Path, compresslevel: int = 6, only: Collection[Path] | None = None
) -> Layer:
    """Pack the tree at root (or only those of its paths) as one gzip layer at dest, atomically."""
    with atomic_path(dest) as tmp, tmp.open("wb") as out:
        compressed = _Hashing(out)
        with gzip.GzipFile(fileobj=compressed, mode="wb", compresslevel=compresslevel, mtime=0) as gz:
            plain = _Hashing(gz)
            with tarfile.open(fileobj=plain, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                for path in _entries(root):
                    if only is not None and path not in only:
                        continue
                    info = tar.gettarinfo(str(path), arcname=str(path.relative_to(root)))
                    if info is None:  # sockets: nothing a layer can carry
                        continue
                    info.mtime, info.uname, info.gname = EPOCH, "", ""
                    if info.isreg():
                        with path.open("rb") as data:
                            tar.addfile(info, data)
                    else:
                        tar.addfile(info)
    return Layer(
        dest, f"sha256:{compressed.sha.hexdigest()}", f"sha256:{plain.sha.hexdigest()}", compressed.size
    )


def _blob(data: dict[str, Any]) -> tuple[bytes, str]:
    raw = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return raw, f"sha256:{hashlib.sha256(raw).hexdigest()}"


def config_json(config: ImageConfig, layers: Sequence[Layer], history: str) -> dict[str, Any]:
    runtime: dict[str, Any] = {
        "Entrypoint": config.entrypoint,
        "Env": [f"{k}={v}" for k, v in config.env.items()],
        "WorkingDir": config.workdir,
        "Labels": config.labels,
    }
    if config.cmd:
        runtime["Cmd"] = config.cmd
    if config.user:
        runtime["User"] = config.user
    return {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": runtime,
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": history} for _ in layers],
    }


def write_archive(
    dest: Path, refs: Sequence[str], config: ImageConfig, layers: Sequence[Layer], history: str
) -> None:
    """The image-layout tar at dest, atomically: one index entry per ref, all the same manifest."""
    config_raw, config_digest = _blob(config_json(config, layers, history))
    manifest_raw, manifest_digest = _blob(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": {"mediaType": MEDIA_CONFIG, "digest": config_digest, "size": len(config_raw)},
            "layers": [{"mediaType": MEDIA_LAYER, "digest": x.digest, "size": x.size} for x in layers],
        }
    )
    entries = [
        {
            "mediaType": MEDIA_MANIFEST,
            "digest": manifest_digest,
            "size": len(manifest_raw),
            "annotations": {CONTAINERD_NAME: ref, REF_NAME: ref.rpartition(":")[2]},
        }
        for ref in refs
    ]
    index_raw, _ = _blob({"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": entries})
    with atomic_path(dest) as tmp, tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:

        def add(name: str, raw: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(raw), EPOCH, 0o644
            tar.addfile(info, io.BytesIO(raw))

        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", index_raw)
        for layer in layers:
            info = tar.gettarinfo(str(layer.path), arcname=_blob_name(layer.digest))
            info.mtime, info.uid, info.gid, info.uname, info.gname = EPOCH, 0, 0, "", ""
            with layer.path.open("rb") as data:
                tar.addfile(info, data)
        add(_blob_name(config_digest), config_raw)
        add(_blob_name(manifest_digest), manifest_raw)


def _blob_name(digest: str) -> str:
    algorithm, _, hexdigest = digest.partition(":")
    return f"blobs/{algorithm}/{hexdigest}"


def read_archive(path: Path) -> Image:
    """Parse an archive, checking every blob it names against its digest and size."""
    with tarfile.open(path) as tar:

        def member(name: str) -> IO[bytes]:
            found = tar.extractfile(name)
            if found is None:
                raise ValueError(f"{name} is not a file")
            return found

        def checked(descriptor: dict[str, Any], keep: bool = True) -> bytes:
            chunks, sha, size = [], hashlib.sha256(), 0
            with member(_blob_name(descriptor["digest"])) as stream:
                while chunk := stream.read(1 << 20):
                    sha.update(chunk)
                    size += len(chunk)
                    if keep:
                        chunks.append(chunk)
            if f"sha256:{sha.hexdigest()}" != descriptor["digest"] or size != descriptor["size"]:
                raise ValueError(f"blob {descriptor['digest']} does not match its descriptor")
            return b"".join(chunks)

        layout = json.loads(member("oci-layout").read())
        if layout != {"imageLayoutVersion": "1.0.0"}:
            raise ValueError(f"not an OCI image layout: {layout}")
        index = json.loads(member("index.json").read())
        if len({m["digest"] for m in index["manifests"]}) != 1:
            raise ValueError("expected every index entry to name one manifest")
        manifest = json.loads(checked(index["manifests"][0]))
        config = json.loads(checked(manifest["config"]))
        for layer in manifest["layers"]:
            checked(layer, keep=False)
    refs = [m["annotations"][CONTAINERD_NAME] for m in index["manifests"]]
    return Image(path, refs, manifest, config)


class _HashingReader(io.RawIOBase):
    def __init__(self, source: io.BufferedIOBase) -> None:
        self.source, self.sha = source, hashlib.sha256()

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self.source.read(size)
        self.sha.update(data)
        return data


def walk(image: Image) -> Iterator[tuple[tarfile.TarFile, tarfile.TarInfo]]:
    """Every member of every layer in order, as a runtime's snapshotter applies them, checking each
    diff_id (no whiteouts: the builder writes none). A member's data is readable until the next."""
    with tarfile.open(image.path) as outer:
        for descriptor, diff_id in zip(
            image.manifest["layers"], image.config["rootfs"]["diff_ids"], strict=True
        ):
            compressed = outer.extractfile(_blob_name(descriptor["digest"]))
            assert compressed is not None  # read_archive saw it
            plain = _HashingReader(gzip.GzipFile(fileobj=compressed))
            with tarfile.open(fileobj=plain, mode="r|") as tar:
                for member in tar:
                    if Path(member.name).name.startswith(".wh."):
                        raise ValueError(f"whiteouts are not supported: {member.name}")
                    yield tar, member
            while plain.read(1 << 20):  # tar's end-of-archive padding
                pass
            if f"sha256:{plain.sha.hexdigest()}" != diff_id:
                raise ValueError(f"layer {descriptor['digest']} does not match its diff_id {diff_id}")


def unpack(image: Image, dest: Path) -> None:
    """Apply the layers in order into dest."""
    for tar, member in walk(image):
        tar.extract(member, dest, numeric_owner=True, filter="fully_trusted")
    for name in RUNTIME_DIRS:
        (dest / name).mkdir(exist_ok=True)
