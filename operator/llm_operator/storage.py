"""Where engines and tokenizers live for the pods that use them: serving pods mount the cache claim
read-only, build Jobs read-write, both at the contract's ENGINE_CACHE_MOUNT; runtime.tokenizerUri's
claim is mounted read-only at TOKENIZER_MOUNT."""

from __future__ import annotations

from dataclasses import dataclass

from llm_operator.contract import ENGINE_CACHE_MOUNT, TOKENIZER_MOUNT


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


@dataclass(frozen=True)
class TokenizerLocation:
    """runtime.tokenizerUri in a serving pod: the claim mounted whole and read-only, like the
    engine cache, so a path missing inside it reaches the launcher's check (which names it)
    rather than failing the kubelet's subPath mount."""

    claim: str
    path: str  # inside the claim

    @property
    def tokenizer_dir(self) -> str:
        return f"{TOKENIZER_MOUNT}/{self.path}".rstrip("/")


def tokenizer_location(uri: str | None) -> TokenizerLocation | None:
    """pvc://CLAIM/PATH (admission refuses other schemes) -> where serving pods read it."""
    if uri is None:
        return None
    scheme, _, rest = uri.partition("://")
    if scheme != "pvc":
        raise ValueError("runtime.tokenizerUri: serving pods mount pvc:// URIs only")
    claim, _, path = rest.partition("/")
    return TokenizerLocation(claim=claim, path=path.strip("/"))


def tokenizer_dir(tokenizer: TokenizerLocation | None, engine: EngineLocation | None) -> str:
    """What pre/postprocessing load and the launcher checks: runtime.tokenizerUri, else the
    tokenizer an engine build copies next to the engine (engine/build.py copy_tokenizer), else
    none (the cpu-reference model encodes bytes)."""
    if tokenizer is not None:
        return tokenizer.tokenizer_dir
    return f"{engine.engine_dir}/tokenizer" if engine is not None else ""
