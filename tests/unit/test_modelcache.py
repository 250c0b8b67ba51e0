"""The model cache fetcher's pure parts: verification digests, the layout's guards, the termination
message's sanitising, error mapping from each protocol's structured fields, and the download loop
(resume, restart, refetch, verified files skipped) with a stand-in source. The fetcher against the
real S3 server and Hugging Face mirror: tests/e2e/test_model_stores.py."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from llm_operator.modelcache import errors, fetch, layout
from llm_operator.modelcache.errors import FetchFailure, sanitize
from llm_operator.modelcache.hub import HubSource
from llm_operator.modelcache.layout import Entry, ModelDir
from llm_operator.modelcache.s3 import failure as s3_failure

KEY = "s3-0123456789abcdef"


def test_git_blob_sha1_is_gits_own_object_id(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(b'{"model_type": "llm-operator-tiny"}\n' * 100)
    git = subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True, check=True)
    assert layout.git_blob_sha1(path) == git.stdout.strip()


def test_multipart_etag_is_the_md5_of_the_parts_md5s(tmp_path: Path) -> None:
    data = os.urandom(2500)
    path = tmp_path / "blob"
    path.write_bytes(data)
    parts = [data[:1000], data[1000:2000], data[2000:]]
    expected = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest() + "-3"
    assert layout.multipart_etag(path, 1000) == expected
    entry = layout.s3_entry("blob", "prefix/blob", 2500, f'"{expected}"', part_size=1000)
    assert entry.algorithm == "md5-multipart"
    assert layout.mismatch(path, entry) is None
    assert layout.mismatch(path, layout.s3_entry("blob", "k", 2500, f'"{expected}"', part_size=999))


def test_s3_etags_choose_the_check() -> None:
    md5 = "9fc03ed7e188fd8b5a9d8030a034252b"
    assert layout.s3_entry("a", "k", 1, f'"{md5}"').algorithm == "md5"
    # SSE-KMS objects' ETags are no MD5: the size alone is checked.
    assert layout.s3_entry("a", "k", 1, '"opaque-kms-etag"').algorithm == "size"


def test_s3_resolved_revision_follows_every_key_size_and_etag_not_the_listing_order() -> None:
    objects = [("p/a", 1, '"aa"'), ("p/b", 2, '"bb"')]
    resolved = layout.s3_resolved(objects)
    assert layout.RESOLVED.fullmatch(resolved)
    assert layout.s3_resolved(list(reversed(objects))) == resolved
    for changed in ([("p/a", 1, '"ab"'), objects[1]], [("p/a", 3, '"aa"'), objects[1]], objects[:1]):
        assert layout.s3_resolved(changed) != resolved


@pytest.mark.parametrize("path", ["../x", "a/../../x", "/etc/passwd", "a//b", ".", layout.MANIFEST])
def test_files_outside_the_model_directory_are_refused(path: str) -> None:
    with pytest.raises(ValueError, match=r"outside the model directory|reserves"):
        layout.safe_relative(path)


def test_model_dir_refuses_keys_and_revisions_that_are_not_names(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--source-key"):
        ModelDir(tmp_path, "../s3-0123456789abcdef", "etags-0123456789abcdef")
    with pytest.raises(ValueError, match="neither a commit"):
        ModelDir(tmp_path, KEY, "main")


def test_finish_writes_the_manifest_last_and_renames_the_directory(tmp_path: Path) -> None:
    model = ModelDir(tmp_path, KEY, "etags-0123456789abcdef")
    model.partial.mkdir(parents=True)
    (model.partial / "a").write_text("x")
    model.record({"a": {"size": 1, "digest": "d"}})
    assert not model.complete()
    entries = [Entry("a", 1, "md5", "d", key="p/a")]
    model.finish(layout.manifest("s3://b/p", "http://s3", "etags-0123456789abcdef", entries))
    assert model.complete() and not model.partial.exists()
    written = json.loads((model.final / layout.MANIFEST).read_text())
    assert written["files"] == [{"path": "a", "size": 1, "algorithm": "md5", "digest": "d"}]
    assert not (model.final / layout.VERIFIED).exists()
    assert model.directory == f"models/{KEY}/etags-0123456789abcdef"


def test_sanitize_makes_one_printable_line_without_secrets() -> None:
    env = {"AWS_SECRET_ACCESS_KEY": "s3cr3t-value", "HF_TOKEN": "hf_abc"}
    text = "denied\r\n\x1b[31mfor s3cr3t-value\x00 at https://user:pw@host/x and hf_abc\t"
    assert sanitize(text, env) == "denied [31mfor [redacted] at https://host/x and [redacted]"
    long = sanitize("x" * 1000, {})
    assert len(long) == errors.MAX_MESSAGE and long.endswith("…")


def test_failures_carry_their_field_and_exit_code() -> None:
    assert FetchFailure("SourceUnreachable", "x").exit_code == errors.EXIT_TRANSIENT
    failure = FetchFailure("SourceUnauthorized", "no\nway")
    assert failure.exit_code == 78
    assert failure.termination_message() == {
        "reason": "SourceUnauthorized",
        "message": "no way",
        "field": "spec.model.source.credentialsSecretRef",
    }


@pytest.mark.parametrize(
    ("code", "status", "reason"),
    [
        ("SignatureDoesNotMatch", 403, "SourceUnauthorized"),
        ("InvalidAccessKeyId", 403, "SourceUnauthorized"),
        ("NoSuchBucket", 404, "SourceNotFound"),
        ("SlowDown", 503, "SourceUnreachable"),
    ],
)
def test_s3_errors_keep_the_status_and_a_known_code_only(code: str, status: int, reason: str) -> None:
    response = {
        "Error": {"Code": code, "Message": "Said the server."},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    failure = s3_failure(response, "s3://b/p")
    assert failure.reason == reason
    assert failure.message.endswith(f"HTTP {status} {code}")
    assert "Said" not in failure.message, "the server's own words never reach status"


class _Response:
    def __init__(self, status: int, headers: dict[str, str], reason: str = "") -> None:
        self.status_code, self.headers, self.reason = status, headers, reason


@pytest.mark.parametrize(
    ("status", "headers", "reason", "said"),
    [
        (404, {"X-Error-Code": "RevisionNotFound", "X-Error-Message": "Invalid rev id: v9"},
         "RevisionNotFound", "HTTP 404 RevisionNotFound"),
        (401, {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"}, "SourceNotFound",
         "HTTP 401 RepoNotFound"),
        (401, {"X-Error-Message": "Invalid credentials in Authorization header"}, "SourceUnauthorized",
         "HTTP 401"),
        (403, {"X-Error-Code": "GatedRepo"}, "SourceUnauthorized", "HTTP 403 GatedRepo"),
        (502, {"X-Error-Code": "<script>see http://evil.example</script>"}, "SourceUnreachable", "HTTP 502"),
    ],
)  # fmt: skip
def test_hub_errors_keep_the_status_and_a_known_error_code_only(
    status: int, headers: dict[str, str], reason: str, said: str
) -> None:
    source = HubSource("hf://org/name", "http://mirror", "v9")
    failure = source.failure(_Response(status, headers, "Bad Gateway"))
    assert (failure.reason, failure.said) == (reason, said)


def test_cache_full_names_the_numbers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    class Stat:
        f_bavail, f_blocks, f_frsize = 2 * 2**18, 10 * 2**18, 4096  # 2 GiB free of 10 GiB

    monkeypatch.setattr(os, "statvfs", lambda _: Stat())
    fetch.check_space(tmp_path, 2 * 2**30)
    with pytest.raises(FetchFailure) as failed:
        fetch.check_space(tmp_path, 3 * 2**30)
    assert failed.value.reason == "CacheFull"
    assert failed.value.message == "needs 3.00 GiB, the claim has 2.00 GiB free of 10.00 GiB"


class Source:
    """Serves `files`; honours Range unless `ranges` is False; records what was asked."""

    def __init__(self, files: dict[str, bytes], ranges: bool = True) -> None:
        self.files, self.ranges = files, ranges
        self.asked: list[tuple[str, int]] = []

    def entries(self) -> list[Entry]:
        md5 = {p: hashlib.md5(d).hexdigest() for p, d in self.files.items()}
        return [Entry(p, len(d), "md5", md5[p], key=p) for p, d in sorted(self.files.items())]

    def open(self, entry: Entry, offset: int) -> tuple[Any, int]:
        self.asked.append((entry.path, offset))
        start = offset if self.ranges else 0
        return io.BytesIO(self.files[entry.path][start:]), start


def _run(model: ModelDir, source: Source, entries: list[Entry] | None = None) -> fetch.Meter:
    entries = entries or source.entries()
    meter = fetch.Meter(sum(e.size for e in entries), len(entries), None, out=io.StringIO())
    model.partial.mkdir(parents=True, exist_ok=True)
    fetch.fetch_into(model, entries, source.open, meter)
    return meter


def test_a_new_pod_skips_verified_files_and_resumes_a_half_file(tmp_path: Path) -> None:
    files = {"a.json": b"a" * 100, "b.bin": os.urandom(5000)}
    model = ModelDir(tmp_path, KEY, "etags-0123456789abcdef")
    source = Source(files)
    _run(model, source)
    (model.partial / "b.bin").write_bytes(files["b.bin"][:1200])  # killed while writing b.bin
    verified = model.verified()
    del verified["b.bin"]
    model.record(verified)
    again = Source(files)
    meter = _run(model, again)
    assert again.asked == [("b.bin", 1200)]
    assert (meter.downloaded, meter.bytes, meter.files) == (3800, 5100, 2)
    assert (model.partial / "b.bin").read_bytes() == files["b.bin"]


def test_a_server_without_ranges_rewrites_the_half_file(tmp_path: Path) -> None:
    files = {"b.bin": os.urandom(3000)}
    model = ModelDir(tmp_path, KEY, "etags-0123456789abcdef")
    model.partial.mkdir(parents=True)
    (model.partial / "b.bin").write_bytes(files["b.bin"][:1000])
    source = Source(files, ranges=False)
    meter = _run(model, source)
    assert source.asked == [("b.bin", 1000)]
    assert (meter.downloaded, meter.bytes) == (3000, 3000)
    assert (model.partial / "b.bin").read_bytes() == files["b.bin"]


def test_a_wrong_file_is_fetched_once_more_then_verification_fails(tmp_path: Path) -> None:
    files = {"b.bin": os.urandom(3000)}
    model = ModelDir(tmp_path, KEY, "etags-0123456789abcdef")
    model.partial.mkdir(parents=True)
    (model.partial / "b.bin").write_bytes(b"\0" * 3000)  # whole size, wrong bytes
    source = Source(files)
    _run(model, source)
    assert source.asked == [("b.bin", 0)]  # the wrong copy was dropped and fetched anew
    lying = Source({"b.bin": b"\1" * 3000})  # serves other bytes than its metadata says
    (model.partial / "b.bin").unlink()
    model.record({})
    with pytest.raises(FetchFailure) as failed:
        _run(model, lying, Source(files).entries())
    assert failed.value.reason == "VerificationFailed"
    assert len(lying.asked) == 2
    assert not (model.partial / "b.bin").exists()


def test_the_termination_message_is_written_for_a_failure(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    code = fetch.main(["--uri", "gs://b/p", "--source-key", "gs-0123456789abcdef",
                       "--cache-root", str(tmp_path), "--termination-log", str(log)])  # fmt: skip
    assert code == 78
    assert json.loads(log.read_text())["reason"] == "SourceNotFound"
