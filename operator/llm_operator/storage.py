"""Where engines, models and tokenizers live for the pods that use them: serving pods mount the
engine cache claim read-only, build Jobs read-write, both at the contract's ENGINE_CACHE_MOUNT;
runtime.tokenizerUri's claim is mounted read-only at TOKENIZER_MOUNT; the model's files are on
spec.model.cache's claim (MODEL_CACHE_MOUNT) or a pvc:// source's (CHECKPOINT_MOUNT), read-only."""

from __future__ import annotations

from dataclasses import dataclass

from llm_operator.contract import CHECKPOINT_MOUNT, ENGINE_CACHE_MOUNT, MODEL_CACHE_MOUNT, TOKENIZER_MOUNT


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


@dataclass(frozen=True)
class ModelLocation:
    """The model's files in a pod: a claim mounted whole and read-only, and a directory in it."""

    claim: str
    path: str  # inside the claim
    volume: str  # the pod's volume name
    mount: str

    @property
    def model_dir(self) -> str:
        return f"{self.mount}/{self.path}".rstrip("/")


def cached_model(claim: str, directory: str) -> ModelLocation:
    """A fetched model: `directory` is models/<source key>/<resolved revision> on the cache claim."""
    return ModelLocation(claim, directory.strip("/"), "model-cache", MODEL_CACHE_MOUNT)


def checkpoint_location(uri: str) -> ModelLocation:
    """A pvc://CLAIM/PATH source, read in place."""
    claim, _, path = uri.removeprefix("pvc://").partition("/")
    return ModelLocation(claim, path.strip("/"), "checkpoint", CHECKPOINT_MOUNT)


def tokenizer_dir(
    tokenizer: TokenizerLocation | None, engine: EngineLocation | None, model: ModelLocation | None = None
) -> str:
    """What pre/postprocessing, the front door and the launcher read: runtime.tokenizerUri, else
    the model's own directory (the checkpoint and its Hugging Face tokenizer files side by side),
    else the tokenizer an engine build copies next to the engine (engine/build.py copy_tokenizer),
    else none (the cpu-reference runtime brings its builtin model's)."""
    if tokenizer is not None:
        return tokenizer.tokenizer_dir
    if model is not None:
        return model.model_dir
    return f"{engine.engine_dir}/tokenizer" if engine is not None else ""
