"""Resizing a running container's slice (hamictl update). Pure: the options as
typed, the container's record, the node's capacities, the other allocations
and what the container uses now in; the record as it is after the change out,
or a refusal that names the option, the value and (when it does not fit) the
GPU and what is free there.

Rules: growing works whenever the GPU has room besides what the others hold;
shrinking memory below what the container uses now needs `force` (then the
limit is set and nothing is freed: new allocations are refused until use falls
below it); slots never change. Without a device, every GPU of the container
gets the new size; with one, only that GPU.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from ...errors import HamiError
from ...names import mig_uuid, number as digits
from ...policies import CORE_POLICIES
from ..node_state import state_layout
from ..node_state.allocator import Capacity, Usage, usage, wanted_mib

MAX_MEM_MIB = 1 << 30
MIB = 1 << 20


class Change(NamedTuple):
    """A validated change; None = left as it is."""
    mem_mib: int | None = None
    mem_percentage: int | None = None
    cores: int | None = None
    priority: int | None = None
    core_policy: str | None = None
    device: str | None = None  # a GPU index or UUID, as typed
    force: bool = False

    def empty(self) -> bool:
        return all(v is None for v in (self.mem_mib, self.mem_percentage, self.cores,
                                       self.priority, self.core_policy))


def _whole(option: str, text, low: int, high: int, what: str) -> int | None:
    if text is None:
        return None
    if not isinstance(text, str) or not digits(text) or not low <= int(text) <= high:
        raise HamiError(option, text, f"must be {what}")
    return int(text)


def parse(gpumem=None, gpumem_percentage=None, gpucores=None, priority=None, core_policy=None,
          device=None, force=False) -> Change:
    """The options as typed (strings, None when not given) -> a Change."""
    mem = _whole("--gpumem", gpumem, 1, MAX_MEM_MIB, f"a whole number of MiB in 1..{MAX_MEM_MIB}")
    pct = _whole("--gpumem-percentage", gpumem_percentage, 1, 100, "a whole percentage in 1..100")
    if mem is not None and pct is not None:
        raise HamiError("--gpumem-percentage", gpumem_percentage,
                        "give --gpumem or --gpumem-percentage, not both")
    cores = _whole("--gpucores", gpucores, 0, 100, "a whole percentage in 0..100")
    prio = _whole("--priority", priority, 0, 1, "0 (high) or 1 (low)")
    if core_policy is not None and core_policy not in CORE_POLICIES:
        raise HamiError("--core-policy", core_policy, "must be one of " + ", ".join(CORE_POLICIES))
    if device is not None and (not isinstance(device, str) or not device):
        raise HamiError("--device", device, "must be a GPU index or UUID")
    change = Change(mem, pct, cores, prio, core_policy, device, bool(force))
    if change.empty():
        raise HamiError("options", "", "nothing to change: give --gpumem, "
                        "--gpumem-percentage, --gpucores, --priority or --core-policy")
    return change


def find(allocations: Mapping[str, Mapping], cid: str, root_name: str | None = None,
         invalid: Mapping[str, Mapping] = {}) -> str:
    """The allocation name of container `cid` (`root_name`: the name that --root
    gives, when the caller named a root). One line when none or two match; an
    entry kept apart as invalid is named as such (hamictl doctor repairs it)."""
    if root_name is not None:
        names = [root_name] if root_name in allocations else []
    else:
        names = sorted(n for n, e in allocations.items() if e.get("id") == cid)
    if len(names) > 1:
        roots = ", ".join(sorted(allocations[n]["runc_root"] for n in names))
        raise HamiError("container", cid, f"is held under {len(names)} runc roots ({roots}): "
                        "name one with --root")
    if names:
        return names[0]
    for name, bad in sorted(invalid.items()):
        if name == root_name or (root_name is None and state_layout.id_of(name) == cid):
            raise HamiError("container", cid, f"its allocation entry {name!r} is invalid "
                            f"({bad.get('reason')}): run hamictl doctor")
    where = "under that runc root" if root_name is not None else "on this node"
    raise HamiError("container", cid, f"has no GPU allocation {where}")


def targets(entry: Mapping, device: str | None) -> list[int]:
    """Positions in entry["devices"] the change applies to."""
    devices = entry["devices"]
    if device is None:
        return list(range(len(devices)))
    for i, d in enumerate(devices):
        if device == d["uuid"] or (digits(device) and int(device) == d["index"]):
            return [i]
    held = ", ".join(f"{d['index']} {d['uuid']}" for d in devices)
    raise HamiError("--device", device, f"is not one of this container's GPUs ({held})")


def _gpu(d: Mapping) -> str:
    return f"GPU {d['index']} ({d['uuid']})"


def _memory_option(change: Change) -> tuple[str, str]:
    if change.mem_mib is not None:
        return "--gpumem", str(change.mem_mib)
    return "--gpumem-percentage", str(change.mem_percentage)


def resize(entry: Mapping, change: Change, caps: Mapping[str, Capacity],
           others: Iterable[Mapping], used_now: Mapping[str, int],
           blocked: Mapping[str, str] = {}) -> dict:
    """The record after the change (a new dict; `entry` is left as it is).
    caps: per GPU UUID; others: every other live allocation; used_now: bytes the
    container's processes hold per GPU UUID now; blocked: GPUs an invalid state
    entry makes unknown (no growth there)."""
    held = usage(others)
    devices = [dict(d) for d in entry["devices"]]
    for i in targets(entry, change.device):
        d = devices[i]
        cap = caps.get(d["uuid"])
        if cap is None:
            raise HamiError("container", entry["id"], f"holds {_gpu(d)}, which this node no "
                            "longer has: run hamictl doctor")
        other = held.get(d["uuid"], Usage())
        memory = change.mem_mib is not None or change.mem_percentage is not None
        if mig_uuid(d["uuid"]) and (memory or change.cores is not None):
            option, value = (("--gpucores", str(change.cores)) if change.cores is not None
                             else _memory_option(change))
            raise HamiError(option, value, f"{_gpu(d)} is a MIG instance, given whole: its memory and "
                            "SMs are the hardware's partition")
        if memory:
            option, value = _memory_option(change)
            new = wanted_mib(change, cap)
            if new > d["mem_mib"]:
                if blocked.get(d["uuid"]):
                    raise HamiError(option, value, f"{_gpu(d)} takes no growth: "
                                    f"{blocked[d['uuid']]}")
                room = cap.mem_mib - other.mem_mib
                if new > room:
                    raise HamiError(option, value, f"does not fit on {_gpu(d)}: "
                                    f"{max(room - d['mem_mib'], 0)} MiB free of {cap.mem_mib} MiB "
                                    f"(this container holds {d['mem_mib']} MiB, others "
                                    f"{other.mem_mib} MiB), {new} MiB asked: at most "
                                    f"{max(room, 0)} MiB fits")
            used = used_now.get(d["uuid"], 0)
            if new * MIB < used and not change.force:
                raise HamiError(option, value, f"{_gpu(d)}: the container uses "
                                f"{-(-used // MIB)} MiB now, more than {new} MiB; --force sets "
                                "it anyway (nothing is freed, new allocations are refused "
                                "until use falls below it)")
            d["mem_mib"] = new
        if change.cores is not None:
            new = change.cores
            if new > d["cores"]:
                if blocked.get(d["uuid"]):
                    raise HamiError("--gpucores", str(new), f"{_gpu(d)} takes no growth: "
                                    f"{blocked[d['uuid']]}")
                room = cap.cores - other.cores
                if new > room:
                    raise HamiError("--gpucores", str(new), f"does not fit on {_gpu(d)}: "
                                    f"{max(room - d['cores'], 0)}% of cores free (this container "
                                    f"holds {d['cores']}%, others {other.cores}%), {new}% asked: "
                                    f"at most {max(room, 0)}% fits")
            d["cores"] = new
    after = dict(entry)
    after["devices"] = devices
    if change.core_policy is not None:
        after["core_policy"] = change.core_policy
    if change.priority is not None:
        after["priority"] = change.priority
    return after
