"""Known GPU products by their GPU Feature Discovery name (nvidia.com/gpu.product).

Used to plan without a cluster (`llm-operator render` with no --nodes), to rank products, and to
fill in what a node's labels leave out. Node labels win where both exist.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuProduct:
    name: str
    memory_mib: int
    compute_capability: tuple[int, int]
    family: str
    nvlink: bool  # GPUs of one node share an NVLink/NVSwitch domain (TP across them is fast)
    gpus_per_node: int  # typical node size, for planning without an inventory
    speed: int  # relative dense bf16 throughput, for ranking only

    @property
    def supports_fp8(self) -> bool:
        return self.compute_capability >= (8, 9)


PRODUCTS: dict[str, GpuProduct] = {
    p.name: p
    for p in (
        GpuProduct("NVIDIA-GB200", 189471, (10, 0), "blackwell", True, 4, 250),
        GpuProduct("NVIDIA-B200", 183359, (10, 0), "blackwell", True, 8, 225),
        GpuProduct("NVIDIA-H200", 143771, (9, 0), "hopper", True, 8, 110),
        GpuProduct("NVIDIA-H100-80GB-HBM3", 81559, (9, 0), "hopper", True, 8, 100),
        GpuProduct("NVIDIA-H100-SXM5-80GB", 81559, (9, 0), "hopper", True, 8, 100),
        GpuProduct("NVIDIA-H100-PCIe", 81559, (9, 0), "hopper", False, 8, 75),
        GpuProduct("NVIDIA-A100-SXM4-80GB", 81920, (8, 0), "ampere", True, 8, 32),
        GpuProduct("NVIDIA-A100-SXM4-40GB", 40960, (8, 0), "ampere", True, 8, 32),
        GpuProduct("NVIDIA-L40S", 46068, (8, 9), "ada-lovelace", False, 4, 37),
        GpuProduct("NVIDIA-L4", 23034, (8, 9), "ada-lovelace", False, 8, 12),
        GpuProduct("NVIDIA-A10G", 23028, (8, 6), "ampere", False, 1, 13),
        GpuProduct("Tesla-T4", 15360, (7, 5), "turing", False, 1, 4),
    )
}
