"""The cache claim's layout and the checks a file passes before it counts as fetched.

    models/<source key>/<resolved>/              whole: it has the manifest (MANIFEST); read only this
    models/<source key>/.partial-<resolved>/     being written; VERIFIED lists its verified files
    models/<source key>/.lock-<resolved>         fcntl.flock'ed by the one fetcher writing it

Verification (what the source itself publishes about each file):
- S3: the size, and the ETag: a plain one is the object's MD5; a multipart one (`<hex>-<N>`) is
  the MD5 of the N parts' binary MD5s, the parts cut at the size HeadObject PartNumber=1 reports.
  Any other ETag (SSE-KMS/SSE-C objects) is opaque: the size alone is checked.
- Hugging Face: the size, and the sha256 for LFS files or the git blob SHA-1 for the others.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

MODELS = "models"
MANIFEST = ".llm-operator-model.json"
VERIFIED = ".llm-operator-verified.json"
SOURCE_KEY = re.compile(r"[a-z0-9]+-[0-9a-f]{16}")
RESOLVED = re.compile(r"[0-9a-f]{40}|etags-[0-9a-f]{16}")
_MD5 = re.compile(r"[0-9a-f]{32}")
_MULTIPART = re.compile(r"([0-9a-f]{32})-([0-9]+)")
CHUNK = 1 << 20


class Corrupt(Exception):
    """The bytes failed a check while streaming (e.g. botocore's validation of the server's
    x-amz-checksum-* header): the file is fetched again like one that fails verification."""


@dataclass(frozen=True)
class Entry:
    """One file of the source: its path in the model directory and what verifies it.
    algorithm: "md5" (plain ETag), "md5-multipart" (digest "<hex>-<N>", parts of part_size),
    "sha256" (Hub LFS), "git-sha1" (Hub blob), "size" (nothing but the size)."""

    path: str
    size: int
    algorithm: str
    digest: str
    part_size: int = 0
    key: str = ""  # the object key (S3) or the path in the repository (Hub)


def safe_relative(path: str) -> str:
    """A path that stays inside the model directory, or ValueError."""
    parts = path.split("/")
    if any(p in ("..", ".", "") for p in parts):  # also "/x" and "a//b" (two keys, one file)
        raise ValueError(f"the source's file {path!r} would be written outside the model directory")
    if parts[-1] in (MANIFEST, VERIFIED):
        raise ValueError(f"the source's file {path!r} has a name the cache reserves")
    return str(PurePosixPath(*parts))


def s3_entry(path: str, key: str, size: int, etag: str, part_size: int = 0) -> Entry:
    etag = etag.strip('"').lower()
    if _MD5.fullmatch(etag):
        return Entry(path, size, "md5", etag, key=key)
    if _MULTIPART.fullmatch(etag) and part_size > 0:
        return Entry(path, size, "md5-multipart", etag, part_size, key=key)
    return Entry(path, size, "size", etag, key=key)


def s3_resolved(objects: list[tuple[str, int, str]]) -> str:
    """`etags-<16 hex>` of the sorted "key\\tsize\\tetag\\n" lines of (key, size, ETag) objects."""
    lines = sorted(f"{key}\t{size}\t{etag.strip(chr(34))}\n" for key, size, etag in objects)
    return "etags-" + hashlib.sha256("".join(lines).encode()).hexdigest()[:16]


def git_blob_sha1(path: Path) -> str:
    """The git object id of the file as a blob (what the Hub lists as a file's blob id)."""
    h = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def multipart_etag(path: Path, part_size: int) -> str:
    parts = []
    with path.open("rb") as f:
        while chunk := f.read(part_size):
            parts.append(hashlib.md5(chunk, usedforsecurity=False).digest())
    return f"{hashlib.md5(b''.join(parts), usedforsecurity=False).hexdigest()}-{len(parts)}"


def digest_of(path: Path, entry: Entry) -> str:
    """The file's digest computed the way `entry.algorithm` says."""
    if entry.algorithm == "git-sha1":
        return git_blob_sha1(path)
    if entry.algorithm == "md5-multipart":
        return multipart_etag(path, entry.part_size)
    if entry.algorithm == "size":
        return entry.digest
    h = hashlib.new(entry.algorithm, usedforsecurity=False) if entry.algorithm == "md5" else hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def mismatch(path: Path, entry: Entry) -> str | None:
    """Why the file is not the source's (None when it is)."""
    size = path.stat().st_size
    if size != entry.size:
        return f"{entry.path}: {size} bytes, the source lists {entry.size}"
    found = digest_of(path, entry)
    if found != entry.digest:
        return f"{entry.path}: {entry.algorithm} {found}, the source lists {entry.digest}"
    return None


class ModelDir:
    """One (source key, resolved revision) under the cache root."""

    def __init__(self, cache_root: Path, source_key: str, resolved: str) -> None:
        if not SOURCE_KEY.fullmatch(source_key):
            raise ValueError(f"--source-key {source_key!r} is not <scheme>-<16 hex>")
        if not RESOLVED.fullmatch(resolved):
            raise ValueError(f"resolved revision {resolved!r} is neither a commit nor etags-<16 hex>")
        self.parent = cache_root / MODELS / source_key
        self.final = self.parent / resolved
        self.partial = self.parent / f".partial-{resolved}"
        self.lock_file = self.parent / f".lock-{resolved}"
        self.directory = f"{MODELS}/{source_key}/{resolved}"  # as the termination message names it

    def complete(self) -> bool:
        return (self.final / MANIFEST).is_file()

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The one writer of this revision (a second pod waits here, then finds it complete)."""
        self.parent.mkdir(parents=True, exist_ok=True)
        with self.lock_file.open("a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def verified(self) -> dict[str, dict[str, Any]]:
        try:
            data: dict[str, dict[str, Any]] = json.loads((self.partial / VERIFIED).read_text())
            return data
        except (OSError, ValueError):
            return {}

    def record(self, verified: dict[str, dict[str, Any]]) -> None:
        write_atomic(self.partial / VERIFIED, json.dumps(verified, indent=1, sort_keys=True).encode())

    def finish(self, manifest: dict[str, Any]) -> None:
        """Manifest written and fsynced, then the directory renamed into place (and the rename
        fsynced): a reader finds the whole model or none."""
        (self.partial / VERIFIED).unlink(missing_ok=True)
        write_atomic(self.partial / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
        for dirpath, _, filenames in os.walk(self.partial):
            for name in filenames:
                _fsync(Path(dirpath) / name)
            _fsync(Path(dirpath))
        os.rename(self.partial, self.final)
        _fsync(self.parent)


def manifest(uri: str, endpoint: str, resolved: str, entries: list[Entry]) -> dict[str, Any]:
    """What the final directory holds (never credentials: the URI and endpoint are the spec's)."""
    files = [
        {"path": e.path, "size": e.size, "algorithm": e.algorithm, "digest": e.digest}
        | ({"partSize": e.part_size} if e.part_size else {})
        for e in entries
    ]
    return {
        "uri": uri,
        "endpoint": endpoint,
        "resolvedRevision": resolved,
        "bytes": sum(e.size for e in entries),
        "files": files,
    }


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
