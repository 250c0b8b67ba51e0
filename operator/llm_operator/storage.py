"""Where engines live for the pods that use them: serving pods mount the cache claim read-only,
build Jobs read-write, both at the contract's ENGINE_CACHE_MOUNT."""

from __future__ import annotations

from dataclasses import dataclass

from llm_operator.contract import ENGINE_CACHE_MOUNT


@dataclass(frozen=True)
class EngineLocation:
    """Where the pods read engines: a PVC sub-path, mounted read-only."""

    claim: str
    sub_path: str  # directory of this cache key inside the claim

    @property
    def engine_dir(self) -> str:
        return f"{ENGINE_CACHE_MOUNT}/{self.sub_path}".rstrip("/")


def engine_location(uri: str, cache_key: str | None) -> EngineLocation:
    """pvc://CLAIM/PATH (+ /KEY for built engines) -> the claim and the directory inside it."""
    scheme, _, rest = uri.partition("://")
    if scheme != "pvc":
        raise ValueError(f"engine storage {uri!r}: serving pods mount pvc:// URIs only")
    claim, _, path = rest.partition("/")
    parts = [p for p in (path.strip("/"), cache_key) if p]
    return EngineLocation(claim=claim, sub_path="/".join(parts))
