"""One GPU of this node as discovery reports it; what the allocator chooses among."""
from __future__ import annotations

from typing import NamedTuple


class GpuInfo(NamedTuple):
    index: int
    uuid: str
    model: str
    memory_mib: int
    minor: int
    arch: str = ""    # compute capability, "9.0"
    brand: str = ""   # as NVIDIA_REQUIRE_* names it: "tesla", "nvidia", "geforcertx", ...
    driver: str = ""  # the driver's version, "550.54.15"
    cuda: str = ""    # the CUDA version the driver supports, "12.4"
