"""The fetch Job's program: one source at one revision into the model cache claim.

    python3 -m llm_operator.modelcache.fetch --uri URI --source-key KEY --cache-root DIR
        [--revision R] [--endpoint URL] [--region R] [--path-style] [--max-bytes-per-second N]

Resolves the revision (hf: the commit; s3: etags-<hash of keys, sizes, ETags>); a complete
`models/<key>/<resolved>/` is a cache hit and nothing is downloaded. Otherwise, under the
revision's lock, each file goes into `.partial-<resolved>/`: files verified by an earlier pod are
skipped, a half file resumes with a Range request (or restarts where the server ignores Range), a
file that fails verification is fetched once more, then VerificationFailed. The manifest is written
last and the directory renamed into place (layout.py).

stdout: progress lines `{"progress": {...}}` at most every PROGRESS_EVERY_S and once at the end.
The termination message (--termination-log) is the result or the failure as JSON; exit 0 done,
78 permanent (the operator stops retrying), 1 transient (the Job retries).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from llm_operator.modelcache.errors import EXIT_TRANSIENT, FetchFailure
from llm_operator.modelcache.layout import CHUNK, MANIFEST, Corrupt, Entry, ModelDir, manifest, mismatch

PROGRESS_EVERY_S = 2.0
TERMINATION_LOG = "/dev/termination-log"
ATTEMPTS = 2  # a file that fails verification is fetched once more

Opener = Callable[[Entry, int], tuple[BinaryIO, int]]


class Meter:
    """Bytes and files so far, printed as progress lines, and the bandwidth cap."""

    def __init__(self, total_bytes: int, total_files: int, cap: int | None, out: Any = sys.stdout) -> None:
        self.bytes = self.files = self.downloaded = 0
        self.total_bytes, self.total_files, self.cap, self.out = total_bytes, total_files, cap, out
        self.started = self.printed = time.monotonic()

    def add(self, n: int, downloaded: bool = True) -> None:
        self.bytes += n
        if downloaded:
            self.downloaded += n
            if self.cap:  # sleep until the average since the start is back under the cap
                ahead = self.downloaded / self.cap - (time.monotonic() - self.started)
                if ahead > 0:
                    time.sleep(ahead)
        if time.monotonic() - self.printed >= PROGRESS_EVERY_S:
            self.progress()

    def progress(self) -> None:
        self.printed = time.monotonic()
        line = {
            "bytes": self.bytes,
            "totalBytes": self.total_bytes,
            "files": self.files,
            "totalFiles": self.total_files,
        }
        print(json.dumps({"progress": line}), file=self.out, flush=True)


def check_space(root: Path, needed: int) -> None:
    st = os.statvfs(root)
    free, size = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    if needed > free:
        raise FetchFailure(
            "CacheFull", f"needs {_size(needed)}, the claim has {_size(free)} free of {_size(size)}"
        )


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 // 100 else f"{n / 2**20:.2f} MiB"


def download(entry: Entry, dest: Path, opener: Opener, meter: Meter) -> None:
    """Append the rest of the file to dest, or rewrite it when the server starts from 0."""
    have = dest.stat().st_size if dest.exists() else 0
    if have >= entry.size:
        return
    stream, start = opener(entry, have)
    try:
        with dest.open("r+b" if start else "wb") as f:
            f.seek(start)
            f.truncate()
            if start < have:
                meter.add(start - have, downloaded=False)
            # Capped: small reads, so that the cap holds within a file too.
            size = min(CHUNK, max(1 << 12, meter.cap // 8)) if meter.cap else CHUNK
            while chunk := stream.read(size):
                f.write(chunk)
                meter.add(len(chunk))
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise FetchFailure("CacheFull", f"the claim filled up while writing {entry.path}") from None
        raise FetchFailure("SourceUnreachable", f"reading {entry.path} failed: {type(e).__name__}") from None
    finally:
        stream.close()


def fetch_into(model: ModelDir, entries: list[Entry], opener: Opener, meter: Meter) -> None:
    """Every entry into model.partial, verified; the verified list kept up to date."""
    verified = model.verified()
    for entry in entries:
        dest = model.partial / entry.path
        done = verified.get(entry.path)
        if (
            done == {"size": entry.size, "digest": entry.digest}
            and dest.is_file()
            and dest.stat().st_size == entry.size
        ):
            meter.files += 1
            meter.add(entry.size, downloaded=False)
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():  # a half file of an earlier pod: counts as fetched until proven wrong
            meter.add(min(dest.stat().st_size, entry.size), downloaded=False)
        for attempt in range(ATTEMPTS):
            try:
                download(entry, dest, opener, meter)
                wrong = mismatch(dest, entry)
            except Corrupt as e:
                wrong = f"{entry.path}: {e}"
            if wrong is None:
                break
            meter.add(-_size_of(dest), downloaded=False)
            dest.unlink(missing_ok=True)
            if attempt == ATTEMPTS - 1:
                raise FetchFailure(
                    "VerificationFailed", f"fetched twice, still not the source's file: {wrong}"
                )
            print(json.dumps({"refetch": entry.path, "why": wrong}), flush=True)
        verified[entry.path] = {"size": entry.size, "digest": entry.digest}
        model.record(verified)
        meter.files += 1


def run(a: argparse.Namespace) -> dict[str, Any]:
    root = Path(a.cache_root)
    scheme = a.uri.partition("://")[0]
    # A commit names its content: a complete directory of it answers without asking the source.
    if scheme == "hf" and a.revision and len(a.revision) == 40:
        model = ModelDir(root, a.source_key, a.revision.lower())
        if model.complete():
            return _result(model, 0)
    source: Any
    if scheme == "s3":
        if a.revision:
            raise FetchFailure(
                "RevisionNotFound", "s3:// sources have no revisions: use a new prefix for new weights"
            )
        from llm_operator.modelcache.s3 import S3Source

        source = S3Source(a.uri, a.endpoint, a.region, a.path_style)
        resolved, entries = source.resolve()
        opener: Opener = source.open
    elif scheme == "hf":
        from llm_operator.modelcache.hub import HubSource

        source = HubSource(a.uri, a.endpoint, a.revision)
        resolved, entries = source.resolve()
        opener = lambda entry, offset: source.open(entry, offset, resolved)  # noqa: E731
    else:
        raise FetchFailure("SourceNotFound", f"the fetcher reads s3:// and hf:// sources, not {scheme}://")
    model = ModelDir(root, a.source_key, resolved)
    if model.complete():
        return _result(model, 0)
    with model.locked():
        if model.complete():  # another pod finished it while this one waited
            return _result(model, 0)
        model.partial.mkdir(exist_ok=True)
        have = sum(min(_size_of(model.partial / e.path), e.size) for e in entries)
        total = sum(e.size for e in entries)
        check_space(root, total - have)
        meter = Meter(total, len(entries), a.max_bytes_per_second)
        fetch_into(model, entries, opener, meter)
        meter.progress()
        model.finish(manifest(a.uri, a.endpoint or "", resolved, entries))
        return _result(model, meter.downloaded)


def _size_of(path: Path) -> int:
    return path.stat().st_size if path.is_file() else 0


def _result(model: ModelDir, downloaded: int) -> dict[str, Any]:
    m = json.loads((model.final / MANIFEST).read_text())
    return {
        "resolvedRevision": m["resolvedRevision"],
        "directory": model.directory,
        "bytes": m["bytes"],
        "files": len(m["files"]),
        "downloadedBytes": downloaded,
    }


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="llm_operator.modelcache.fetch", description=__doc__.split("\n\n")[0])
    p.add_argument("--uri", required=True, help="s3://BUCKET/PREFIX or hf://ORG/NAME")
    p.add_argument("--source-key", required=True, help="models/<source key>/ on the claim")
    p.add_argument("--cache-root", required=True, help="where the claim is mounted")
    p.add_argument("--revision", help="hf:// only: branch, tag or commit (default main)")
    p.add_argument("--endpoint", help="an S3-compatible endpoint, or a Hugging Face mirror")
    p.add_argument("--region", help="s3:// only")
    p.add_argument("--path-style", action="store_true", help="s3:// only: path-style addressing")
    p.add_argument("--max-bytes-per-second", type=int, help="bandwidth cap (average)")
    p.add_argument("--termination-log", default=TERMINATION_LOG, help="where the result goes (JSON)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    try:
        result: dict[str, Any] = run(a)
        code = 0
    except FetchFailure as e:
        result, code = e.termination_message(), e.exit_code
        print(f"fetch: {e.reason}: {e.message}", file=sys.stderr, flush=True)
    except ValueError as e:  # a --source-key or a resolved revision of the wrong shape
        result, code = {"reason": "SourceNotFound", "message": str(e), "field": "spec.model.source.uri"}, 78
        print(f"fetch: {e}", file=sys.stderr, flush=True)
    try:
        Path(a.termination_log).write_text(json.dumps(result))
    except OSError as e:
        print(f"fetch: cannot write {a.termination_log}: {e.strerror}", file=sys.stderr, flush=True)
        code = code or EXIT_TRANSIENT
    print(json.dumps({"result": result}), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
