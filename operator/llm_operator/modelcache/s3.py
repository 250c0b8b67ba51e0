"""s3://BUCKET/PREFIX from any S3-compatible endpoint, with boto3.

Credentials are boto3's own chain (the pod's env from the Secret the spec names: AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN; or a web identity); with none, requests are unsigned
(public buckets). Errors keep only S3's structured Code and Message.
"""

from __future__ import annotations

from typing import Any, BinaryIO, cast

import boto3
import botocore.exceptions
from botocore import UNSIGNED
from botocore.config import Config

from llm_operator.modelcache.errors import FetchFailure, server_words
from llm_operator.modelcache.layout import Corrupt, Entry, s3_entry, s3_resolved, safe_relative

# Refusals of the credentials, whatever the status: versitygw v1.8.0 answers an unknown access key
# with 404 XAdminUserNotFound (versity/versitygw s3err/s3err.go), AWS with 403 InvalidAccessKeyId.
UNAUTHORIZED = {
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
    "AllAccessDisabled", "AuthorizationHeaderMalformed", "InvalidSecurity", "XAdminUserNotFound",
}  # fmt: skip
NOT_FOUND = {"NoSuchBucket", "NoSuchKey", "NotFound", "404"}


class S3Source:
    def __init__(self, uri: str, endpoint: str | None, region: str | None, path_style: bool) -> None:
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        if not bucket:
            raise FetchFailure("SourceNotFound", f"{uri} names no bucket: use s3://BUCKET/PREFIX")
        self.uri, self.bucket = uri, bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        session = boto3.session.Session()
        signed = session.get_credentials() is not None
        config = Config(
            region_name=region or session.region_name or "us-east-1",
            s3={"addressing_style": "path" if path_style else "auto"},
            retries={"max_attempts": 3, "mode": "standard"},
            connect_timeout=10,
            read_timeout=60,
            **({} if signed else {"signature_version": UNSIGNED}),
        )
        self.client: Any = session.client("s3", endpoint_url=endpoint or None, config=config)

    def resolve(self) -> tuple[str, list[Entry]]:
        """Every object under the prefix (folder markers aside) -> (etags-<hash>, entries)."""
        objects: list[tuple[str, int, str]] = []
        with self.errors():
            for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix
            ):
                objects += [(o["Key"], o["Size"], o["ETag"]) for o in page.get("Contents", [])]
        objects = [o for o in objects if not o[0].endswith("/")]
        if not objects:
            raise FetchFailure("SourceNotFound", f"no objects under {self.uri} (bucket {self.bucket} exists)")
        entries = []
        for key, size, etag in sorted(objects):
            try:
                path = safe_relative(key[len(self.prefix) :])
            except ValueError as e:
                raise FetchFailure("VerificationFailed", str(e)) from None
            entries.append(s3_entry(path, key, size, etag, self._part_size(key, etag)))
        return s3_resolved(objects), entries

    def _part_size(self, key: str, etag: str) -> int:
        """The first part's size of a multipart object (how its ETag was computed), else 0."""
        if "-" not in etag:
            return 0
        with self.errors():
            head = self.client.head_object(Bucket=self.bucket, Key=key, PartNumber=1)
        return int(head["ContentLength"])

    def open(self, entry: Entry, offset: int) -> tuple[BinaryIO, int]:
        """The object's bytes from `offset` (a Range request); IfMatch its listed ETag, so an object
        replaced since the listing fails (412) instead of mixing two versions."""
        ranged = {"Range": f"bytes={offset}-"} if offset else {}
        with self.errors():
            got = self.client.get_object(
                Bucket=self.bucket, Key=entry.key, IfMatch=f'"{entry.digest}"', **ranged
            )
        honoured = offset if got.get("ContentRange") else 0
        return cast(BinaryIO, _Body(got["Body"], self)), honoured

    def errors(self) -> Any:
        return _Errors(self)


class _Body:
    """The object's stream, its errors as the fetcher's: botocore checks the server's own checksum
    (x-amz-checksum-*, which versitygw records at upload) as the bytes arrive."""

    def __init__(self, body: Any, source: S3Source) -> None:
        self.body, self.source = body, source

    def read(self, size: int) -> bytes:
        with self.source.errors():
            try:
                data: bytes = self.body.read(size)
            except botocore.exceptions.FlexibleChecksumError as e:
                raise Corrupt(str(e)) from None
        return data

    def close(self) -> None:
        self.body.close()


class _Errors:
    """boto3's exceptions as FetchFailures, inside a `with`."""

    def __init__(self, source: S3Source) -> None:
        self.source = source

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, e: BaseException | None, tb: Any) -> None:
        if e is None or isinstance(e, FetchFailure):
            return
        if isinstance(e, botocore.exceptions.ClientError):
            raise failure(e.response, self.source.uri) from None
        if isinstance(
            e, botocore.exceptions.NoCredentialsError | botocore.exceptions.PartialCredentialsError
        ):
            raise FetchFailure(
                "SourceUnauthorized", f"incomplete S3 credentials: {type(e).__name__}"
            ) from None
        if isinstance(e, botocore.exceptions.BotoCoreError | OSError):
            raise FetchFailure(
                "SourceUnreachable", f"reading {self.source.uri} failed: {type(e).__name__}"
            ) from None


def failure(response: dict[str, Any], uri: str) -> FetchFailure:
    """An S3 error response (boto3's ClientError.response) as a FetchFailure."""
    error = response.get("Error", {})
    meta = response.get("ResponseMetadata", {})
    code, status = str(error.get("Code", "")), meta.get("HTTPStatusCode")
    words = server_words(code, status)
    if code in UNAUTHORIZED or status in (401, 403):
        return FetchFailure("SourceUnauthorized", f"S3 refused {uri}: {words}")
    if code in NOT_FOUND or status == 404:
        return FetchFailure("SourceNotFound", f"S3 has no {uri}: {words}")
    return FetchFailure("SourceUnreachable", f"S3 failed on {uri}: {words}")
