"""Devices named as NVIDIA's runtime takes them, in NVIDIA_VISIBLE_DEVICES and
in CDI: a GPU index ("0"), a MIG instance by GPU:MIG index ("0:1"), a GPU- or
MIG- UUID, or "all"; each bare or as the CDI device name nvidia.com/gpu=<name>.
Pure: text in, the names out, or a refusal naming the key and the value."""
from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NamedTuple

from ...errors import HamiError
from ...names import gpu_uuid

CDI_KIND = "nvidia.com/gpu"
MAX_INDEX = 1023
_INDEX = re.compile(r"[0-9]{1,4}")
_MIG_INDEX = re.compile(r"([0-9]{1,4}):([0-9]{1,4})")


class Named(NamedTuple):
    every: bool = False              # "all"
    indices: tuple[int, ...] = ()
    mig_indices: tuple[str, ...] = ()  # "0:1", without leading zeros
    uuids: tuple[str, ...] = ()

    @property
    def count(self) -> int | None:
        return None if self.every else len(self.indices) + len(self.mig_indices) + len(self.uuids)


def is_cdi(item: str) -> bool:
    return item.startswith(CDI_KIND + "=")


def _index(key: str, value: str, text: str) -> int:
    if int(text) > MAX_INDEX:
        raise HamiError(key, value, f"index {text} out of range 0..{MAX_INDEX}")
    return int(text)


def parse(key: str, value: str, items: Iterable[str], max_devices: int) -> Named:
    """`items`: the names, each bare or a CDI name of kind nvidia.com/gpu."""
    items = list(items)
    every, indices, migs, uuids = False, [], [], []
    for item in items:
        kind, eq, name = item.rpartition("=")
        if eq and kind != CDI_KIND:
            raise HamiError(key, value, f"{item!r} is not a CDI name of kind {CDI_KIND}")
        mig = _MIG_INDEX.fullmatch(name)
        if name.lower() == "all":
            every = True
        elif _INDEX.fullmatch(name):
            indices.append(_index(key, value, name))
        elif mig:
            migs.append(f"{_index(key, value, mig[1])}:{_index(key, value, mig[2])}")
        elif gpu_uuid(name) and name[:4].upper() in ("GPU-", "MIG-"):
            uuids.append(name)
        else:
            raise HamiError(key, value, f"{item!r} is not a GPU index, a MIG instance's GPU:MIG "
                            "index, a GPU- or MIG- UUID, or all")
    named = Named(every, tuple(indices), tuple(migs), tuple(uuids))
    if every and len(items) > 1:
        raise HamiError(key, value, "names all and more")
    if (indices or migs) and uuids:
        raise HamiError(key, value, "mixes indices and UUIDs")
    if named.count is not None and len({*indices, *migs, *uuids}) != named.count:
        raise HamiError(key, value, "names a device twice")
    if (named.count or 0) > max_devices:
        raise HamiError(key, value, f"more than {max_devices} devices")
    return named
