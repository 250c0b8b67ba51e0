"""hf://ORG/NAME from the Hugging Face Hub or a mirror of it (the spec's endpoint = HF_ENDPOINT).

huggingface_hub resolves the revision (model_info: the commit) and lists the files with what
verifies them (list_repo_tree: size, blob id, LFS sha256). The bytes come from the resolve URL of
that commit (hf_hub_url), read here with urllib so that this program decides about ranges, the
bandwidth cap and the partial file: the token (HF_TOKEN) goes with build_hf_headers, and is not
forwarded on a redirect (the Hub redirects LFS files to its CDN).

Errors keep only the HTTP status and the Hub's X-Error-Code when it is one the Hub defines
(errors.py: nothing else the server wrote reaches status). As olah
0.5.4 answers from a local mirror (olah/errors.py, olah/mirror/repos.py): an unknown repository is
401 with X-Error-Code RepoNotFound, an unknown revision 404 with X-Error-Code RevisionNotFound,
and a file is served whole (200, no Range support), which the fetcher then restarts from byte 0.
Its HEAD of a file answers X-Repo-Commit and an ETag (the git blob id, or the sha256 of an LFS
file); the fetcher takes commit and digests from model_info and the tree listing instead.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from typing import Any, BinaryIO, cast

from huggingface_hub import HfApi, hf_hub_url
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.hf_api import RepoFile
from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]

from llm_operator.modelcache.errors import FetchFailure, server_words
from llm_operator.modelcache.layout import Entry, safe_relative

DEFAULT_ENDPOINT = "https://huggingface.co"
TIMEOUT_S = 60


class HubSource:
    def __init__(self, uri: str, endpoint: str | None, revision: str | None) -> None:
        self.uri = uri
        self.repo = uri.removeprefix("hf://").strip("/")
        if self.repo.count("/") != 1:
            raise FetchFailure("SourceNotFound", f"{uri} is not hf://ORG/NAME")
        self.endpoint = (endpoint or DEFAULT_ENDPOINT).rstrip("/")
        self.revision = revision or "main"
        self.token = os.environ.get("HF_TOKEN") or None
        self.api = HfApi(endpoint=self.endpoint, token=self.token)

    def resolve(self) -> tuple[str, list[Entry]]:
        """The revision's commit and every file of it."""
        try:
            commit = self.api.model_info(self.repo, revision=self.revision).sha
            tree = list(self.api.list_repo_tree(self.repo, revision=commit, recursive=True))
        except HfHubHTTPError as e:
            raise self.revision_failure(self.failure(e.response)) from None
        except (OSError, ValueError) as e:  # requests' and urllib3's connection errors are OSErrors
            raise FetchFailure(
                "SourceUnreachable", f"reading {self.uri} from {self.endpoint} failed: {type(e).__name__}"
            ) from None
        if not commit:
            raise FetchFailure(
                "RevisionNotFound", f"{self.endpoint} named no commit for {self.repo} at {self.revision}"
            )
        entries = []
        for item in tree:
            if not isinstance(item, RepoFile):  # a folder
                continue
            try:
                path = safe_relative(item.path)
            except ValueError as e:
                raise FetchFailure("VerificationFailed", str(e)) from None
            if item.lfs is not None:
                entries.append(Entry(path, item.size, "sha256", item.lfs.sha256, key=item.path))
            else:
                entries.append(Entry(path, item.size, "git-sha1", item.blob_id, key=item.path))
        if not entries:
            raise FetchFailure("SourceNotFound", f"{self.repo} has no files at {self.revision}")
        return commit, sorted(entries, key=lambda e: e.path)

    def revision_failure(self, failure: FetchFailure) -> FetchFailure:
        """olah's mirror answers an unknown revision as an unknown repository (401 RepoNotFound):
        when the repository's refs are readable, it is the revision that is missing."""
        if failure.reason != "SourceNotFound":
            return failure
        try:
            self.api.list_repo_refs(self.repo)
        except (HfHubHTTPError, OSError, ValueError):
            return failure
        # Its branch and tag names are the server's words: not quoted.
        return FetchFailure(
            "RevisionNotFound",
            f"{self.repo} has no revision {self.revision} (the repository is readable: see its branches "
            f"and tags); the server answered {failure.said}",
            failure.said,
        )

    def open(self, entry: Entry, offset: int, commit: str) -> tuple[BinaryIO, int]:
        """The file's bytes at `commit` from `offset` when the server honours Range (206), else
        from 0 (200)."""
        request = urllib.request.Request(
            hf_hub_url(self.repo, entry.key, revision=commit, endpoint=self.endpoint)
        )
        for name, value in build_hf_headers(token=self.token, library_name="llm-operator").items():
            if name.lower() == "authorization":
                request.add_unredirected_header(name, value)
            else:
                request.add_header(name, value)
        if offset:
            request.add_header("Range", f"bytes={offset}-")
        try:
            response = urllib.request.urlopen(request, timeout=TIMEOUT_S)
        except urllib.error.HTTPError as e:
            raise self.failure(_Status(e.code, e.headers)) from None
        except OSError as e:
            raise FetchFailure(
                "SourceUnreachable",
                f"downloading {entry.path} from {self.endpoint} failed: {type(e).__name__}",
            ) from None
        return cast(BinaryIO, response), offset if response.status == 206 else 0

    def failure(self, response: Any) -> FetchFailure:
        """A Hub error response (requests', httpx's or urllib's) as a FetchFailure."""
        status = getattr(response, "status_code", None)
        headers = getattr(response, "headers", {}) or {}
        code = headers.get("X-Error-Code")
        words = server_words(code, status)
        if code == "RevisionNotFound":
            return FetchFailure(
                "RevisionNotFound", f"{self.repo} has no revision {self.revision}: {words}", words
            )
        if code in ("RepoNotFound", "EntryNotFound") or status == 404:
            # The Hub answers 401 RepoNotFound for a private repository without a valid token too.
            return FetchFailure(
                "SourceNotFound",
                f"{self.endpoint} has no {self.repo} readable with the given token: {words}",
                words,
            )
        if code == "GatedRepo" or status in (401, 403):
            return FetchFailure("SourceUnauthorized", f"{self.endpoint} refused {self.repo}: {words}", words)
        return FetchFailure("SourceUnreachable", f"{self.endpoint} failed on {self.repo}: {words}", words)


class _Status:
    """urllib's HTTPError in the shape failure() reads."""

    def __init__(self, status: int, headers: Any) -> None:
        self.status_code, self.headers = status, headers
