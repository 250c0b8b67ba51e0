"""A model the cache holds already, for tests of what is served once it is there."""

from __future__ import annotations

from llm_operator.engine.state import ModelFact, ModelObserved

CACHED = ModelObserved(
    ModelFact.RECORDED,
    directory="models/s3-0123456789abcdef/etags-fedcba9876543210",
    resolved_revision="etags-fedcba9876543210",
    bytes=1024,
    total_bytes=1024,
    files=4,
    total_files=4,
)


def cached(*_: str) -> ModelObserved:
    """desired()'s `models` lookup: every model is in the cache."""
    return CACHED
