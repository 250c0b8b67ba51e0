"""Why a fetch failed, as the termination message says it: a reason, one line, the field to fix.

The message reaches the LLMDeployment's status and Events, so nothing a server wrote is copied into
it (the endpoint is user-named): of an error response only the HTTP status number and the
protocol's error code, when it is one of the codes S3 or the Hub define (KNOWN_CODES), are kept;
messages, reason phrases and unknown codes are dropped. sanitize() makes the message one printable
line of at most MAX_MESSAGE characters, without URL credentials or the values of the credential
variables the pod has.
"""

from __future__ import annotations

import os
import re
import unicodedata

MAX_MESSAGE = 300
EXIT_PERMANENT = 78  # the Job's podFailurePolicy fails the Job at once
EXIT_TRANSIENT = 1  # the Job retries (backoffLimit); a new pod resumes
# What the pod's environment may hold from the credentials Secret (envFrom).
SECRET_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "HF_TOKEN")
# Each reason's field of the LLMDeployment, and whether retrying can help.
FIELDS = {
    "SourceUnauthorized": "spec.model.source.credentialsSecretRef",
    "SourceNotFound": "spec.model.source.uri",
    "RevisionNotFound": "spec.model.revision",
    "SourceUnreachable": "spec.model.source.endpoint",
    "CacheFull": "spec.model.cache.claimName",
    "VerificationFailed": "spec.model.source.uri",
}
TRANSIENT = {"SourceUnreachable"}
_USERINFO = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]*@")


class FetchFailure(Exception):
    def __init__(self, reason: str, message: str, said: str = "") -> None:
        assert reason in FIELDS, reason
        super().__init__(message)
        self.reason = reason
        self.message = sanitize(message)
        self.said = sanitize(said)  # the server's own words, as the message quotes them

    @property
    def exit_code(self) -> int:
        return EXIT_TRANSIENT if self.reason in TRANSIENT else EXIT_PERMANENT

    def termination_message(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.message, "field": FIELDS[self.reason]}


def sanitize(text: str, environ: dict[str, str] | None = None) -> str:
    """One printable line: control characters dropped, whitespace runs collapsed, `user:pass@` of
    URLs and the values of SECRET_ENV removed, cut to MAX_MESSAGE characters."""
    env = os.environ if environ is None else environ
    for name in SECRET_ENV:
        if value := env.get(name):
            text = text.replace(value, "[redacted]")
    text = "".join(
        " " if c.isspace() else c for c in text if c.isspace() or unicodedata.category(c)[0] != "C"
    )
    text = _USERINFO.sub(r"\1", " ".join(text.split()))
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


# Error codes the protocols define (S3's Error/Code, the Hub's X-Error-Code): a server's answer is
# reduced to one of these and its HTTP status.
S3_CODES = frozenset({
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
    "AllAccessDisabled", "AuthorizationHeaderMalformed", "InvalidSecurity", "NoSuchBucket", "NoSuchKey",
    "NotFound", "InvalidBucketName", "PermanentRedirect", "SlowDown", "InternalError",
    "ServiceUnavailable", "RequestTimeout", "InvalidRequest", "InvalidRange", "XAdminUserNotFound",
})  # fmt: skip
HUB_CODES = frozenset({"RepoNotFound", "RevisionNotFound", "EntryNotFound", "GatedRepo", "DisabledRepo"})
KNOWN_CODES = S3_CODES | HUB_CODES


def server_words(code: str | None, status: int | None) -> str:
    """What the server answered, in fixed words: `HTTP 404 RepoNotFound`, the code only when the
    protocol defines it."""
    known = code if code in KNOWN_CODES else None
    said = " ".join(part for part in (f"HTTP {status}" if status else None, known) if part)
    return said or "no error details"
