"""The model cache's keys, shared by the operator and the fetch image (standard library only).

source_key names a source's directory on the claim, `models/<source key>/<resolved revision>/`;
fetch_key names one request of it (claim, source, requested revision): the data key of the
namespace's `llm-model-cache-index` ConfigMap and the suffix of the fetch Job's name.
"""

from __future__ import annotations

import hashlib


def _hex16(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def source_key(uri: str, endpoint: str | None) -> str:
    """`<scheme>-<16 hex>`: one directory per source; the endpoint is part of it (a mirror's copy
    of a model is another source than the Hub's)."""
    scheme = uri.partition("://")[0]
    return f"{scheme}-{_hex16(uri + chr(10) + (endpoint or ''))}"


def fetch_key(claim: str, uri: str, endpoint: str | None, revision: str | None) -> str:
    """16 hex of (claim, uri, endpoint, requested revision): the same request on the same claim
    is fetched once, by whichever deployment asks first."""
    return _hex16("\n".join((claim, uri, endpoint or "", revision or "")))
