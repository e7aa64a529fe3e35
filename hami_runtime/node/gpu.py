"""One GPU of this node as discovery reports it; what the allocator chooses among."""
from __future__ import annotations

from collections import namedtuple  # not typing.NamedTuple: importing typing costs each create ms


class GpuInfo(namedtuple("GpuInfo", "index uuid model memory_mib minor")):
    __slots__ = ()
    index: int
    uuid: str
    model: str
    memory_mib: int
    minor: int
