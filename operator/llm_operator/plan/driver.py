"""The CUDA driver GPU Feature Discovery reports on a node (labels.CUDA_DRIVER_LABELS), and what a
serving release needs of it (DriverFloor)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from llm_operator import labels as L
from llm_operator import releases
from llm_operator.plan import gpus

Version = tuple[int, ...]  # (580, 95, 5); as many parts as the labels give, major first


def driver_of(labels: Mapping[str, str]) -> tuple[Version | None, str | None]:
    """The driver's version as numbers, for comparing, and as written (580.95.05), for messages:
    from GFD's current label names, else its older ones; up to the first part that is missing or
    not a number. (None, None) for a node GFD did not label (or labelled with no number)."""
    for names in L.CUDA_DRIVER_LABELS:
        parts: list[str] = []
        for name in names:
            if not labels.get(name, "").isdigit():
                break
            parts.append(labels[name])
        if parts:
            return tuple(int(p) for p in parts), ".".join(parts)
    return None, None


def _version(text: str) -> Version:
    return tuple(int(p) for p in text.split("."))


@dataclass(frozen=True)
class DriverFloor:
    """A release's CUDA driver needs: `minimum` (its CUDA's driver branch) on any GPU, or, on a
    data-center GPU, one of the older long-term branches CUDA forward compatibility runs it on, at
    that branch's minimum version (releases.Release.datacenter_drivers)."""

    minimum: int
    datacenter: tuple[Version, ...]

    @classmethod
    def of(cls, release: releases.Release) -> DriverFloor:
        return cls(int(release.min_driver), tuple(_version(v) for v in release.datacenter_drivers))

    @property
    def coarse(self) -> int:
        """The lowest driver major the floor admits on any GPU: what node affinity can say
        (render/placement.py) without one term per branch, GPU class and label generation."""
        return min(self.minimum, *(branch[0] for branch in self.datacenter))

    def admits(self, product: str, driver: Version | None) -> bool:
        """Whether a node of `product` with this driver runs the release; an unknown driver is not
        checked. Versions compare as far as both give parts: a node labelled with its major only
        is on the branch, and taken as at or above its minimum."""
        if driver is None or driver[0] >= self.minimum:
            return True
        return gpus.is_datacenter(product) and any(
            driver[0] == branch[0] and driver[: len(branch)] >= branch[: len(driver)]
            for branch in self.datacenter
        )

    def __str__(self) -> str:
        """580, or on a data-center GPU 535.86+ (R535), 550.54+ (R550) or 570.26+ (R570)."""
        branches = [f"{'.'.join(map(str, b))}+ (R{b[0]})" for b in self.datacenter]
        listed = ", ".join(branches[:-1]) + f" or {branches[-1]}" if len(branches) > 1 else "".join(branches)
        return f"{self.minimum}, or on a data-center GPU {listed}" if branches else str(self.minimum)
