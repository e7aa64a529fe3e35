"""One GPU (or MIG instance) of this node as discovery reports it; what the
allocator chooses among."""
from __future__ import annotations

from typing import NamedTuple


class GpuInfo(NamedTuple):
    index: int        # NVML's index of the GPU (a MIG instance's: its GPU's)
    uuid: str
    model: str
    memory_mib: int
    minor: int        # /dev/nvidia<minor> (a MIG instance's: its GPU's)
    arch: str = ""    # compute capability, "9.0"
    brand: str = ""   # as NVIDIA_REQUIRE_* names it: "tesla", "nvidia", "geforcertx", ...
    driver: str = ""  # the driver's version, "550.54.15"
    cuda: str = ""    # the CUDA version the driver supports, "12.4"
    mig_mode: bool = False    # a GPU in MIG mode: its instances are the devices, not it
    parent: str = ""          # a MIG instance's: its GPU's UUID
    mig_index: int = -1       # a MIG instance's place on its GPU: the 1 of "0:1"
    gpu_instance: int = -1    # a MIG instance's GPU and compute instance ids (its nvidia-caps nodes)
    compute_instance: int = -1

    @property
    def is_mig(self) -> bool:
        return bool(self.parent)

    @property
    def name(self) -> str:
        """As NVIDIA_VISIBLE_DEVICES names it by index: "0", or "0:1" for a MIG instance."""
        return f"{self.index}:{self.mig_index}" if self.parent else str(self.index)
