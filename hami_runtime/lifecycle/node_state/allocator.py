"""Choosing GPUs for a request. Pure: GPUs, current allocations and a request
in, grants out (or a refusal naming the request)."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from ...errors import HamiError
from ...names import mig_uuid
from ...node.gpu import GpuInfo
from ..request.request_keys import ENV_KEYS

SIZE_KEYS = ("gpumem", "gpumem-percentage", "gpucores")


class Grant(NamedTuple):
    index: int
    uuid: str
    mem_mib: int
    cores: int

    def to_json(self) -> dict:
        return dict(self._asdict())


class Capacity(NamedTuple):
    slots: int
    mem_mib: int
    cores: int = 100


class Usage(NamedTuple):
    slots: int = 0
    mem_mib: int = 0
    cores: int = 0


def capacity(gpu: GpuInfo, split_count: int, memory_scaling: float) -> Capacity:
    """A MIG instance is one container's, whole; a GPU in MIG mode is no one's
    (its instances are the devices)."""
    if gpu.mig_mode:
        return Capacity(slots=0, mem_mib=0)
    if gpu.is_mig:
        return Capacity(slots=1, mem_mib=gpu.memory_mib)
    return Capacity(slots=split_count, mem_mib=int(gpu.memory_mib * memory_scaling))


def usage(entries: Iterable[Mapping]) -> dict[str, Usage]:
    """Per GPU UUID: what the given allocation entries hold."""
    used: dict[str, Usage] = {}
    for entry in entries:
        for device in entry.get("devices", ()):
            u = used.get(device["uuid"], Usage())
            used[device["uuid"]] = Usage(u.slots + 1, u.mem_mib + int(device["mem_mib"]),
                                         u.cores + int(device["cores"]))
    return used


def blocked(invalid: Mapping[str, Mapping], entries: Iterable[Mapping], gpus: list[GpuInfo],
            caps: Mapping[str, Capacity]) -> dict[str, str]:
    """GPU UUID -> why no new allocation may go there: an invalid state entry
    names it (one that names no GPU readably blocks them all), or a valid
    entry claims more of it than it has. Nothing invalid counts as free."""
    known = {g.uuid for g in gpus}
    found: dict[str, str] = {}
    for name, bad in sorted(invalid.items()):
        why = f"invalid state entry {name!r} ({bad.get('reason')}): run hamictl doctor"
        entry = bad.get("entry")
        devices = entry.get("devices") if isinstance(entry, dict) else None
        uuids = [d.get("uuid") if isinstance(d, dict) else None for d in devices] \
            if isinstance(devices, list) else []
        readable = uuids and all(isinstance(u, str) for u in uuids)
        named = [u for u in uuids if u in known] if readable else sorted(known)
        for uuid in named:
            found.setdefault(uuid, why)
    for entry in entries:
        for device in entry.get("devices", ()):
            cap = caps.get(device["uuid"])
            if cap is not None and device["mem_mib"] > cap.mem_mib:
                found.setdefault(device["uuid"], f"entry {entry.get('id')!r} holds "
                                 f"{device['mem_mib']} MiB of a {cap.mem_mib} MiB GPU: "
                                 "run hamictl doctor")
    return found


def wanted_mib(request, cap: Capacity, default_memory_mib: int = 0) -> int:
    """MiB a request (or a resize: both have mem_mib and mem_percentage) asks of a GPU."""
    if request.mem_mib is not None:
        return request.mem_mib
    if request.mem_percentage is not None:
        return max(1, cap.mem_mib * request.mem_percentage // 100)
    if default_memory_mib:
        return min(default_memory_mib, cap.mem_mib)
    return cap.mem_mib


def _named(request, gpu: GpuInfo) -> bool:
    """Whether the request names this device by UUID or index."""
    return gpu.uuid in request.use_uuids or (
        gpu.name in request.use_mig_indices if gpu.is_mig else gpu.index in request.use_indices)


def _matches(request, gpu: GpuInfo) -> bool:
    model = gpu.model.lower()
    names_devices = request.use_uuids or request.use_indices or request.use_mig_indices
    if gpu.mig_mode or ((gpu.is_mig or names_devices) and not _named(request, gpu)):
        return False  # MIG instances only when named, and never their GPU

    if gpu.uuid in request.avoid_uuids:
        return False
    if request.use_types and not any(t in model for t in request.use_types):
        return False
    if any(t in model for t in request.avoid_types):
        return False
    return True


def _room(cap: Capacity, used: Usage, mem_mib: int, cores: int, block: str = "") -> str:
    """'' when the GPU fits the slice, else why not."""
    if block:
        return block
    if used.slots + 1 > cap.slots:
        return f"{used.slots}/{cap.slots} slots used"
    if used.mem_mib + mem_mib > cap.mem_mib:
        return f"{cap.mem_mib - used.mem_mib} of {cap.mem_mib} MiB free, {mem_mib} asked"
    if used.cores + cores > cap.cores:
        return f"{cap.cores - used.cores}% of cores free, {cores}% asked"
    return ""


def node_has(gpus: list[GpuInfo]) -> str:
    """'the node has 2 GPU(s)' (and its MIG instances), for a refusal."""
    instances = sum(1 for g in gpus if g.is_mig)
    text = f"the node has {len(gpus) - instances} GPU(s)"
    return text + (f" and {instances} MIG instance(s)" if instances else "")


def allocate(request, gpus: list[GpuInfo], entries: Iterable[Mapping], *, split_count: int,
             memory_scaling: float, default_memory_mib: int = 0, default_cores: int = 0,
             policy: str = "binpack", invalid: Mapping[str, Mapping] = {}) -> list[Grant]:
    entries = list(entries)
    used = usage(entries)
    by_uuid = {g.uuid: g for g in gpus}
    caps = {g.uuid: capacity(g, split_count, memory_scaling) for g in gpus}
    block = blocked(invalid, entries, gpus, caps)

    if request.assigned:
        grants = []
        for device in request.assigned:
            gpu = by_uuid.get(device.uuid)
            if gpu is None:
                raise HamiError("hami.io/vgpu-devices-allocated", device.uuid,
                                "no GPU with this UUID on this node")
            why = _room(caps[gpu.uuid], used.get(gpu.uuid, Usage()), device.mem_mib, device.cores,
                        block.get(gpu.uuid, ""))
            if why:
                raise HamiError("hami.io/vgpu-devices-allocated", device.uuid, f"GPU full: {why}")
            grants.append(Grant(gpu.index, gpu.uuid, device.mem_mib, device.cores))
        return grants

    _check_named(request, gpus)
    count = request.count if request.count is not None else sum(
        1 for g in gpus if not (g.is_mig or g.mig_mode))
    cores = request.cores if request.cores is not None else default_cores
    candidates = [g for g in gpus if _matches(request, g)]
    if not candidates:
        raise HamiError("request", request.describe(),
                        f"no GPU on this node matches its filters ({node_has(gpus)})")
    fitting, states = [], []
    for gpu in candidates:
        mem = gpu.memory_mib if gpu.is_mig else wanted_mib(request, caps[gpu.uuid], default_memory_mib)
        u = used.get(gpu.uuid, Usage())
        why = _room(caps[gpu.uuid], u, mem, 0 if gpu.is_mig else cores, block.get(gpu.uuid, ""))
        if why:
            states.append(f"GPU {gpu.name}: {why}")
        else:
            fitting.append((gpu, mem))
            states.append(f"GPU {gpu.name} has room ({caps[gpu.uuid].mem_mib - u.mem_mib} of "
                          f"{caps[gpu.uuid].mem_mib} MiB free, {mem} asked)")
    if len(fitting) < count:
        matched = "" if len(candidates) == len(gpus) else f", {len(candidates)} match the request"
        raise HamiError("request", request.describe(), f"{len(fitting)} of {count} GPU(s) have room: "
                        f"{node_has(gpus)}{matched}; {'; '.join(states)}")

    def load(item):
        gpu, _ = item
        u = used.get(gpu.uuid, Usage())
        return (u.mem_mib / max(caps[gpu.uuid].mem_mib, 1), u.slots)

    if policy == "spread":
        fitting.sort(key=lambda item: (load(item), item[0].index))
    else:  # binpack: the fullest GPU that still fits
        fitting.sort(key=lambda item: (tuple(-x for x in load(item)), item[0].index))
    return [Grant(g.index, g.uuid, mem, 0 if g.is_mig else cores) for g, mem in fitting[:count]]


def _check_named(request, gpus: list[GpuInfo]) -> None:
    """Every device the request names is here, and can be given: a MIG instance
    whole (no size asked), a GPU only while it is not in MIG mode."""
    key = request.naming_key()
    by_name = {g.uuid: g for g in gpus} | {g.name: g for g in gpus}
    # sizes as written: the node's defaults and visible_devices_alone pass an instance by
    sizes = [k for k in request.keys if k in ENV_KEYS or k.partition("/")[2] in SIZE_KEYS]
    for name in (*request.use_uuids, *map(str, request.use_indices), *request.use_mig_indices):
        gpu = by_name.get(name)
        if gpu is None:
            device = "MIG instance" if ":" in name or mig_uuid(name) else "GPU"
            what = "index" if name[:1].isdigit() else "UUID"
            raise HamiError(key, name, f"no {device} with this {what} on this node")
        if gpu.mig_mode:
            instances = ", ".join(g.name for g in gpus if g.parent == gpu.uuid) or "none made yet"
            raise HamiError(key, name, f"GPU {gpu.index} is in MIG mode: name one of its MIG "
                            f"instances ({instances})")
        if gpu.is_mig and sizes:
            raise HamiError(key, name, f"MIG instance {gpu.name} is given whole (its memory and SMs are "
                            f"the hardware's partition): ask no {', '.join(sizes)} with it")
