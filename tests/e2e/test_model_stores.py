"""The model cache's fetcher (llm_operator.modelcache.fetch, the fetch Job's program) against the
test world's real stores: versitygw (S3) and olah (a Hugging Face mirror), run on 127.0.0.1 by
tests/e2e/stores.py exactly as `up` runs them in the cluster's namespace. What the servers logged
proves what was, and was not, downloaded.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from llm_operator.modelcache.layout import MANIFEST, VERIFIED

from e2e.cluster import artifacts
from tests.e2e.stores import Fetcher, hub_gets, local_stores, s3_gets

pytestmark = pytest.mark.e2e

S3_KEY, HF_KEY = "s3-00000000000000a1", "hf-00000000000000b2"
HF_URI = f"hf://{artifacts.HF_REPO}"


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[artifacts.Stores]:
    with local_stores(tmp_path_factory.mktemp("stores")) as running:
        yield running


@pytest.fixture
def fetcher(tmp_path: Path) -> Fetcher:
    (tmp_path / "claim").mkdir()
    return Fetcher(tmp_path / "claim")


def seed(stores: artifacts.Stores, seed: int) -> Path:
    return artifacts.checkpoint_cache(Path(stores.root) / "cache") / f"seed-{seed}"


def s3_args(stores: artifacts.Stores) -> list[str]:
    return ["--endpoint", stores.s3_endpoint, "--region", artifacts.REGION, "--path-style"]


def same_files(directory: Path, checkpoint: Path) -> None:
    for path in checkpoint.iterdir():
        assert (directory / path.name).read_bytes() == path.read_bytes(), path.name


def git_commit(stores: artifacts.Stores, revision: str) -> str:
    repo = stores.mirrors / "models" / artifacts.HF_REPO
    return subprocess.run(["git", "-C", str(repo), "rev-parse", f"{revision}^{{commit}}"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip


@pytest.mark.parametrize(("prefix", "seed_of"), artifacts.S3_MODELS.items())
def test_s3_prefix_is_fetched_whole_and_verified(
    stores: artifacts.Stores, fetcher: Fetcher, prefix: str, seed_of: int
) -> None:
    done = fetcher(
        f"s3://{artifacts.BUCKET}/{prefix}", S3_KEY, *s3_args(stores), credentials=stores.credentials
    )
    assert done.code == 0, done.stderr
    directory = fetcher.cache_root / done.result["directory"]
    same_files(directory, seed(stores, seed_of))
    manifest = json.loads((directory / MANIFEST).read_text())
    algorithms = {f["path"]: f["algorithm"] for f in manifest["files"]}
    # tiny-llama's weights were a multipart upload: both kinds of ETag were checked.
    assert algorithms["config.json"] == "md5"
    assert algorithms["model.safetensors"] == ("md5-multipart" if prefix == "tiny-llama" else "md5")
    assert done.result["resolvedRevision"].startswith("etags-")
    assert done.result["downloadedBytes"] == done.result["bytes"] == manifest["bytes"]
    assert stores.secret_key not in (directory / MANIFEST).read_text()
    last = json.loads(done.stdout.splitlines()[-2])["progress"]
    assert last == {"bytes": manifest["bytes"], "totalBytes": manifest["bytes"], "files": 4, "totalFiles": 4}


@pytest.mark.parametrize(("revision", "seed_of"), artifacts.HF_REVISIONS)
def test_mirror_revision_is_fetched_at_its_commit(
    stores: artifacts.Stores, fetcher: Fetcher, revision: str, seed_of: int
) -> None:
    done = fetcher(HF_URI, HF_KEY, "--revision", revision, "--endpoint", stores.hf_endpoint)
    assert done.code == 0, done.stderr
    assert done.result["resolvedRevision"] == git_commit(stores, revision)
    directory = fetcher.cache_root / done.result["directory"]
    same_files(directory, seed(stores, seed_of))
    files = {f["path"]: f["algorithm"] for f in json.loads((directory / MANIFEST).read_text())["files"]}
    assert files["model.safetensors"] == "sha256"  # an LFS file: the mirror lists its sha256
    assert files["config.json"] == "git-sha1"


def test_huggingface_hub_reads_the_mirror(stores: artifacts.Stores, tmp_path: Path) -> None:
    """What the fetcher relies on, through huggingface_hub itself: olah resolves tags and branches,
    lists files with LFS metadata, serves them; an unknown revision is an error."""
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import RepositoryNotFoundError

    api = HfApi(endpoint=stores.hf_endpoint)
    for revision, seed_of in artifacts.HF_REVISIONS:
        info = api.model_info(artifacts.HF_REPO, revision=revision)
        assert info.sha == git_commit(stores, revision)
        tree = {f.path: f for f in api.list_repo_tree(artifacts.HF_REPO, revision=info.sha, recursive=True)}
        weights = (seed(stores, seed_of) / "model.safetensors").read_bytes()
        assert tree["model.safetensors"].lfs.size == len(weights)  # type: ignore[union-attr]
        got = hf_hub_download(artifacts.HF_REPO, "model.safetensors", revision=revision,
                              endpoint=stores.hf_endpoint, cache_dir=tmp_path / revision)  # fmt: skip
        assert Path(got).read_bytes() == weights
    # olah's local mirror answers an unknown revision as an unknown repository (401 RepoNotFound).
    with pytest.raises(RepositoryNotFoundError):
        api.model_info(artifacts.HF_REPO, revision="no-such-revision")


def test_a_cached_model_is_not_downloaded_again(stores: artifacts.Stores, fetcher: Fetcher) -> None:
    uri = f"s3://{artifacts.BUCKET}/tiny-llama"
    first = fetcher(uri, S3_KEY, *s3_args(stores), credentials=stores.credentials)
    hf_first = fetcher(HF_URI, HF_KEY, "--revision", "v1", "--endpoint", stores.hf_endpoint)
    assert first.code == hf_first.code == 0
    s3_before = s3_gets(stores, "tiny-llama/model.safetensors")
    hub_before = hub_gets(stores, "model.safetensors")
    again = fetcher(uri, S3_KEY, *s3_args(stores), credentials=stores.credentials)
    hf_again = fetcher(HF_URI, HF_KEY, "--revision", "v1", "--endpoint", stores.hf_endpoint)
    # A pinned commit needs no question to the mirror at all.
    pinned = fetcher(
        HF_URI, HF_KEY, "--revision", hf_first.result["resolvedRevision"], "--endpoint", "http://0.0.0.0:9"
    )
    for run, before in ((again, first), (hf_again, hf_first), (pinned, hf_first)):
        assert run.code == 0, run.stderr
        assert run.result == {**before.result, "downloadedBytes": 0}
    assert s3_gets(stores, "tiny-llama/model.safetensors") == s3_before
    assert hub_gets(stores, "model.safetensors") == hub_before


@pytest.mark.parametrize(
    ("uri", "extra", "credentials", "reason", "words"),
    [
        ("s3://models/tiny-llama", [], {"AWS_ACCESS_KEY_ID": "WRONG", "AWS_SECRET_ACCESS_KEY": "wrong-key"},
         "SourceUnauthorized", "XAdminUserNotFound"),
        ("s3://models/tiny-llama", [], "bad-secret", "SourceUnauthorized", "SignatureDoesNotMatch"),
        ("s3://no-such-bucket/tiny-llama", [], None, "SourceNotFound", "HTTP 404 NoSuchBucket"),
        ("s3://models/no-such-prefix", [], None, "SourceNotFound", "no objects under s3://models/no-such-prefix"),
        (HF_URI, ["--revision", "v9"], {}, "RevisionNotFound", "RepoNotFound"),
        ("hf://llm-operator/no-such-model", [], {}, "SourceNotFound", "RepoNotFound"),
    ],
)  # fmt: skip
def test_sources_that_cannot_be_read_fail_permanently_with_the_servers_status_and_code(
    stores: artifacts.Stores, fetcher: Fetcher, uri: str, extra: list[str], credentials: object, reason: str,
    words: str,
) -> None:  # fmt: skip
    if credentials is None:
        credentials = stores.credentials
    elif credentials == "bad-secret":
        credentials = {**stores.credentials, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    endpoint = stores.s3_endpoint if uri.startswith("s3") else stores.hf_endpoint
    args = [*extra, "--endpoint", endpoint, *(["--path-style"] if uri.startswith("s3") else [])]
    done = fetcher(uri, S3_KEY if uri.startswith("s3") else HF_KEY, *args, credentials=credentials)  # type: ignore[arg-type]
    assert done.code == 78, done.stderr
    assert done.result["reason"] == reason, done.result
    assert words in done.result["message"]
    assert "secret" not in done.result["message"]
    # Only a status number and a code the protocol defines: none of the server's own sentences.
    for said in ("No user exists", "The specified bucket", "Repository not found"):
        assert said not in done.result["message"], done.result["message"]
    assert not list(fetcher.cache_root.glob("models/*/[!.]*"))  # nothing final was written


def test_a_corrupted_file_is_fetched_again(stores: artifacts.Stores, fetcher: Fetcher) -> None:
    """A whole-size file of other bytes (a disk error, a tampered claim) fails verification and is
    fetched once more."""
    uri = f"s3://{artifacts.BUCKET}/tiny-llama-v2"
    first = fetcher(uri, S3_KEY, *s3_args(stores), credentials=stores.credentials)
    final = fetcher.cache_root / first.result["directory"]
    partial = final.with_name(".partial-" + final.name)
    final.rename(partial)
    (partial / MANIFEST).unlink()
    weights = partial / "model.safetensors"
    weights.write_bytes(b"\0" * weights.stat().st_size)
    before = s3_gets(stores, "tiny-llama-v2/model.safetensors")
    done = fetcher(uri, S3_KEY, *s3_args(stores), credentials=stores.credentials)
    assert done.code == 0, done.stderr
    assert '"refetch": "model.safetensors"' in done.stdout
    assert s3_gets(stores, "tiny-llama-v2/model.safetensors") == before + 1
    same_files(final, seed(stores, 1))


def test_an_object_unlike_its_etag_fails_verification(stores: artifacts.Stores, fetcher: Fetcher) -> None:
    """versitygw serves what its disk holds with the ETag and CRC it recorded at upload: bytes
    changed behind its back fail botocore's check of that CRC as they arrive (the ETag check would
    follow), are fetched twice, then VerificationFailed."""
    client = artifacts.s3_client(stores)
    body = b'{"tampered": false}\n'
    client.put_object(Bucket=artifacts.BUCKET, Key="tampered/config.json", Body=body)
    (stores.s3_data / artifacts.BUCKET / "tampered/config.json").write_bytes(b'{"tampered": true!}\n')
    done = fetcher(
        f"s3://{artifacts.BUCKET}/tampered", S3_KEY, *s3_args(stores), credentials=stores.credentials
    )
    assert done.code == 78, done.stderr
    assert done.result["reason"] == "VerificationFailed"
    assert "config.json: Expected checksum" in done.result["message"]
    assert s3_gets(stores, "tampered/config.json") == 2


@pytest.mark.parametrize("scheme", ["s3", "hf"])
def test_a_killed_fetch_resumes_without_refetching_verified_files(
    stores: artifacts.Stores, fetcher: Fetcher, scheme: str
) -> None:
    """Killed while model.safetensors streams in (capped at 100 kB/s, ~9 s for 853 kB): the next
    run keeps config.json (verified) and the half file, asking S3 for the rest only (Range); olah
    serves files whole, so there the half file is fetched again from its start."""
    if scheme == "s3":
        uri, key, args, creds = (
            f"s3://{artifacts.BUCKET}/tiny-llama",
            S3_KEY,
            s3_args(stores),
            stores.credentials,
        )
    else:
        uri, key, args, creds = HF_URI, HF_KEY, ["--revision", "v1", "--endpoint", stores.hf_endpoint], {}

    def gets(name: str) -> int:
        return s3_gets(stores, f"tiny-llama/{name}") if scheme == "s3" else hub_gets(stores, name)

    before = {name: gets(name) for name in ("config.json", "model.safetensors")}
    proc = fetcher.start(uri, key, *args, "--max-bytes-per-second", "100000", credentials=creds)
    half = None
    deadline = time.monotonic() + 30
    while half is None and time.monotonic() < deadline:
        found = list(fetcher.cache_root.glob("models/*/.partial-*/model.safetensors"))
        if found and found[0].stat().st_size > 100_000:
            half = found[0]
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    assert half is not None, "the fetch never got into model.safetensors"
    kept = half.stat().st_size
    total = (seed(stores, 0) / "model.safetensors").stat().st_size
    assert 0 < kept < total
    verified = set(json.loads((half.parent / VERIFIED).read_text()))
    assert verified == ({"config.json"} if scheme == "s3" else {".gitattributes", "config.json"})
    done = fetcher(uri, key, *args, credentials=creds)
    assert done.code == 0, done.stderr
    same_files(fetcher.cache_root / done.result["directory"], seed(stores, 0))
    assert gets("config.json") == before["config.json"] + 1  # once, by the killed run
    assert gets("model.safetensors") == before["model.safetensors"] + 2
    after = sum(
        (seed(stores, 0) / name).stat().st_size for name in ("tokenizer.json", "tokenizer_config.json")
    )
    assert done.result["downloadedBytes"] == (total - kept if scheme == "s3" else total) + after
