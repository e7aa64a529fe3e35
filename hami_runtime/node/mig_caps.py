"""The nvidia-caps device nodes that give a process access to a MIG instance:
/dev/nvidia-caps/nvidia-cap<minor> for its GPU instance and its compute
instance, with the minors the driver lists in /proc/driver/nvidia-caps/mig-minors
("gpu<GPU minor>/gi<id>/access <minor>", "gpu<GPU minor>/gi<id>/ci<id>/access <minor>")."""
from __future__ import annotations

from ..errors import HamiError
from .gpu import GpuInfo

MAJOR_NAME = "nvidia-caps"  # in /proc/devices
MAX_BYTES = 1 << 20


def parse(text: str) -> dict[str, int]:
    minors: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            minors[parts[0]] = int(parts[1])
    return minors


def read(path: str) -> dict[str, int]:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return parse(handle.read(MAX_BYTES))
    except OSError as exc:
        raise HamiError("config mig_minors", path, f"cannot read: {exc.strerror}") from None


def access_minors(minors: dict[str, int], instance: GpuInfo, path: str) -> list[int]:
    """The caps minors of one MIG instance: its GPU instance's, then its compute instance's."""
    gi = f"gpu{instance.minor}/gi{instance.gpu_instance}"
    names = (f"{gi}/access", f"{gi}/ci{instance.compute_instance}/access")
    missing = [n for n in names if n not in minors]
    if missing:
        raise HamiError("config mig_minors", path, f"lists no {missing[0]} (MIG instance {instance.name})")
    return [minors[n] for n in names]
