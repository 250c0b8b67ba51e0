"""Known GPU products, keyed by their GPU Feature Discovery name (nvidia.com/gpu.product).

GFD writes the NVML device name with spaces replaced by '-' ("NVIDIA H100 80GB HBM3" ->
NVIDIA-H100-80GB-HBM3). The table serves three purposes:
- planning without a cluster (`llm-operator render` without --nodes): typical node size, memory;
- ranking products the user did not rank (`speed`);
- filling in what a node's labels leave out (older GFD versions, hand-written node files).
Node labels win where both exist.

`speed` is a rough relative serving throughput per GPU (H100 SXM = 100), weighing memory bandwidth
(decode) and dense 16-bit tensor throughput (prefill). It only orders products; never a promise.
"""

from __future__ import annotations

from dataclasses import dataclass

# Suffixes GFD appends for shared GPUs; the facts are those of the underlying product.
SHARED_SUFFIX = "-SHARED"
MIG_MARKER = "-MIG-"


@dataclass(frozen=True)
class GpuProduct:
    name: str
    memory_mib: int  # as NVML reports it (what nvidia.com/gpu.memory carries)
    compute_capability: tuple[int, int]
    family: str  # nvidia.com/gpu.family spelling
    nvlink: bool  # the GPUs of one node share an NVLink/NVSwitch domain; False: PCIe only
    gpus_per_node: int  # typical node size, for planning without an inventory
    speed: int
    nvlink_domain_gpus: int = 0  # multi-node NVLink domain (NVL72 rack): GPUs in one gpu.clique


PRODUCTS: dict[str, GpuProduct] = {
    p.name: p
    for p in (
        GpuProduct("NVIDIA-GB200", 189471, (10, 0), "blackwell", True, 4, 250, nvlink_domain_gpus=72),
        GpuProduct("NVIDIA-B200", 183359, (10, 0), "blackwell", True, 8, 230),
        GpuProduct("NVIDIA-H200", 143771, (9, 0), "hopper", True, 8, 130),
        GpuProduct("NVIDIA-H100-80GB-HBM3", 81559, (9, 0), "hopper", True, 8, 100),
        GpuProduct("NVIDIA-H100-SXM5-80GB", 81559, (9, 0), "hopper", True, 8, 100),
        GpuProduct("NVIDIA-H100-NVL", 95830, (9, 0), "hopper", False, 8, 90),  # NVLink bridges pairs only
        GpuProduct("NVIDIA-H100-PCIe", 81559, (9, 0), "hopper", False, 8, 75),
        GpuProduct("NVIDIA-A100-SXM4-80GB", 81920, (8, 0), "ampere", True, 8, 45),
        GpuProduct("NVIDIA-A100-SXM4-40GB", 40960, (8, 0), "ampere", True, 8, 40),
        GpuProduct("NVIDIA-A100-80GB-PCIe", 81920, (8, 0), "ampere", False, 4, 42),
        GpuProduct("NVIDIA-A100-PCIE-40GB", 40960, (8, 0), "ampere", False, 4, 38),
        GpuProduct("NVIDIA-L40S", 46068, (8, 9), "ada-lovelace", False, 4, 30),
        GpuProduct("NVIDIA-RTX-6000-Ada-Generation", 49140, (8, 9), "ada-lovelace", False, 4, 28),
        GpuProduct("NVIDIA-L40", 46068, (8, 9), "ada-lovelace", False, 4, 25),
        GpuProduct("Tesla-V100-SXM2-32GB", 32768, (7, 0), "volta", True, 8, 20),
        GpuProduct("Tesla-V100-SXM2-16GB", 16384, (7, 0), "volta", True, 8, 20),
        GpuProduct("NVIDIA-A10", 23028, (8, 6), "ampere", False, 1, 14),
        GpuProduct("NVIDIA-A10G", 23028, (8, 6), "ampere", False, 1, 12),
        GpuProduct("NVIDIA-L4", 23034, (8, 9), "ada-lovelace", False, 8, 10),
        GpuProduct("Tesla-T4", 15360, (7, 5), "turing", False, 1, 5),
    )
}


def lookup(product: str) -> GpuProduct | None:
    """The table's facts for a GFD product string; shared GPUs report as their product."""
    return PRODUCTS.get(product.removesuffix(SHARED_SUFFIX))


def is_datacenter(product: str) -> bool:
    """Whether CUDA forward compatibility runs on it (older long-term drivers run newer CUDA;
    releases.Release.datacenter_drivers): NVIDIA's data-center GPUs, every product in the table.
    The RTX 6000 Ada is a workstation card; the CUDA compatibility guide extends forward
    compatibility to "select NGC Server Ready SKUs of RTX cards", so it is not refused for it.
    Products the table lacks (GeForce) are held to the release's own driver floor. MIG slices are
    of their whole GPU."""
    return lookup(product.split(MIG_MARKER)[0]) is not None


def is_partitioned(product: str) -> bool:
    """Time-sliced or MIG GPUs: a slice is not a whole GPU, so they are never chosen unasked."""
    return product.endswith(SHARED_SUFFIX) or MIG_MARKER in product


def family_of(compute_capability: tuple[int, int]) -> str:
    """GFD's family names by compute capability (for products the table does not know)."""
    major, minor = compute_capability
    if major >= 10:
        return "blackwell"
    if major == 9:
        return "hopper"
    if (major, minor) == (8, 9):
        return "ada-lovelace"
    return {8: "ampere", 7: "turing" if minor >= 5 else "volta"}.get(major, "unknown")
