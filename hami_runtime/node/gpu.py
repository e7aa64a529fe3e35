"""One GPU of this node as discovery reports it; what the allocator chooses among."""
from __future__ import annotations

from typing import NamedTuple


class GpuInfo(NamedTuple):
    index: int
    uuid: str
    model: str
    memory_mib: int
    minor: int
