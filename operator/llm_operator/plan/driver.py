"""The CUDA driver GPU Feature Discovery reports on a node (labels.CUDA_DRIVER_LABELS)."""

from __future__ import annotations

from collections.abc import Mapping

from llm_operator import labels as L


def driver_of(labels: Mapping[str, str]) -> tuple[int | None, str | None]:
    """The driver's major (580) and version (580.95.05), from GFD's current label names, else its
    older ones; (None, None) for a node GFD did not label (or labelled with no number)."""
    for major, *rest in L.CUDA_DRIVER_LABELS:
        if labels.get(major, "").isdigit():
            return int(labels[major]), ".".join(labels[k] for k in (major, *rest) if labels.get(k))
    return None, None
