"""The node seen whole, for `hamictl metrics`, `top` and `gpus`: per GPU what the
allocator has promised and what the driver reports now, per container who it
is (its Kubernetes pod and name) and where its request came from.

- The allocator's figures come from its state file, read without its lock (the
  file is replaced atomically) and with its own checks: entries whose container
  is gone are left out, as the next allocator operation frees them; an invalid
  entry is counted apart; a file that cannot be read is that reading's error.
- The driver is read through NVML in a worker thread, with a deadline: a driver
  that is slow or hangs costs a reader at most the deadline, and a worker still
  stuck in an earlier call is never joined by another. What the worker read
  before the deadline counts (per GPU), the rest is unread. Memory held by
  processes of no slice is the driver's per-process memory of every process no
  container's region counts (nor is its first process): a process on the host,
  a container of another runtime, or a process that bypassed libvgpu.
- A container's names come from the annotations the engine wrote into its spec
  (containerd's and CRI-O's keys, as the allocator record keeps them): the
  tenant's text, read here once for every tool: cut to MAX_LABEL characters,
  valid UTF-8, printable but for newlines (display_text.value); a table shows
  them as one printable line.
"""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional

from ..lifecycle.request.request_keys import ENV_KEYS, VISIBLE
from ..node.gpu import GpuInfo
from . import display_text

MiB = 1024 * 1024
MAX_LABEL = display_text.MAX_SHOWN
DRIVER_DEADLINE_S = 0.5

# (pod namespace, pod name, container name) keys, containerd's first, then CRI-O's
# (pod_identity.ENGINES); nerdctl names a container outside any pod.
NAME_KEYS = {
    "pod_namespace": ("io.kubernetes.cri.sandbox-namespace", "io.kubernetes.pod.namespace"),
    "pod_name": ("io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name"),
    "container_name": ("io.kubernetes.cri.container-name", "io.kubernetes.container.name",
                       "nerdctl/name"),
}
ENV_SOURCE_KEYS = (VISIBLE,) + ENV_KEYS


def bounded(value) -> str:
    """A label value from what a container's spec said (display_text.value):
    text only, cut to MAX_LABEL, valid UTF-8, printable but for newlines."""
    return display_text.value(value, MAX_LABEL)


def identity_of(entry) -> Dict[str, str]:
    """The identity annotations an allocator record keeps, keys and values
    bounded ({} where it keeps none)."""
    identity = entry.get("identity") if isinstance(entry, dict) else None
    if not isinstance(identity, dict):
        return {}
    return {bounded(k): bounded(v) for k, v in identity.items() if isinstance(k, str)}


def request_source(request) -> str:
    """'hami-scheduler' (HAMi's decision), 'env' or 'annotation', from the keys the
    request was written with; '' where the record does not say."""
    keys = [k for k in request if isinstance(k, str)] if isinstance(request, dict) else []
    if any(k.endswith("/vgpu-devices-allocated") for k in keys):
        return "hami-scheduler"
    if keys and all(k in ENV_SOURCE_KEYS for k in keys):
        return "env"
    return "annotation" if keys else ""


def container_meta(entry) -> Dict[str, str]:
    """pod_namespace, pod_name, container_name, request_source of an allocator
    record ('' for what it does not say)."""
    entry = entry if isinstance(entry, dict) else {}
    identity = identity_of(entry)
    meta = {label: next((identity[k] for k in keys if identity.get(k)), "")
            for label, keys in NAME_KEYS.items()}
    meta["request_source"] = request_source(entry.get("request"))
    return meta


def shown_name(meta) -> str:
    """<namespace>/<pod>/<container> of a pod's container, its own name outside a
    pod, else '-' (meta: container_meta's keys, as a dict or attributes)."""
    get = meta.get if isinstance(meta, dict) else lambda key: getattr(meta, key)
    if get("pod_name"):
        text = "/".join(x for x in (get("pod_namespace"), get("pod_name"), get("container_name")) if x)
    else:
        text = get("container_name") or "-"
    return display_text.one_line(text)


def enforcement_of(agent, name: str, uuid: str = "") -> dict:
    """What the node agent (node/agent_state.AgentState, running) found of the
    container `name` (on its device `uuid`, else all of them): the driver's
    figures, the excess, what it did, and the flags the tables show."""
    from ..node.enforcement import Record, flags
    rec = agent.containers.get(name) or Record()
    pick = (lambda table: table.get(uuid)) if uuid else (lambda table: sum(table.values()) if table else None)
    return {"flags": flags(rec, uuid), "driver_memory_bytes": pick(rec.held),
            "memory_excess_bytes": pick(rec.excess) or 0, "driver_sm_pct": pick(rec.sm_use),
            "sm_excess_pct": pick(rec.sm_excess) or 0, "frozen": bool(rec.frozen_until),
            "killed": rec.killed, "actions": dict(rec.actions), "last_action": rec.last_action,
            "last_action_at": agent.wall.get(name)}


def or_unknown(value, unit: str = "") -> str:
    return "?" if value is None else f"{value}{unit}"


# ---- the allocator's side ------------------------------------------------------

@dataclass
class AllocatorView:
    entries: Dict[str, dict] = field(default_factory=dict)  # live, valid records by name
    invalid: Dict[str, dict] = field(default_factory=dict)  # name -> {"entry", "reason"}
    error: str = ""  # why the state file could not be read ("" when it was, or is absent)


def read_allocator(state_dir: str, alive=None) -> AllocatorView:
    from ..files import read_state_file
    from ..lifecycle.node_state import store
    alive = alive or store.entry_alive
    path = os.path.join(state_dir, store.STATE_FILE)
    if not os.path.lexists(path):
        return AllocatorView()
    try:
        parsed = store.parse_state(json.loads(read_state_file(path, store.MAX_STATE_BYTES)))
    except store.HamiError as exc:
        return AllocatorView(error=exc.line())
    except (OSError, ValueError) as exc:
        return AllocatorView(error=f"{path}: {exc}")
    if parsed is None:
        return AllocatorView(error=f"{path}: not a version {store.VERSION} state file")
    entries, invalid = parsed
    return AllocatorView({n: e for n, e in entries.items() if alive(e)}, invalid)


# ---- the driver's side -----------------------------------------------------------

@dataclass
class DriverGpu:
    uuid: str
    used_bytes: int
    utilization_pct: Optional[int]  # None: the driver does not say
    processes: Dict[int, int]  # host pid -> device memory it holds (0: not said)


@dataclass
class DriverReading:
    inventory: List[GpuInfo] = field(default_factory=list)  # [] until listed
    figures: Dict[str, DriverGpu] = field(default_factory=dict)  # by UUID, GPUs read
    error: str = ""  # why some or all GPUs were not read
    seconds: float = 0.0


_NVML_STARTED = []  # one nvmlInit this process holds, so that each read is cheap


def _nvml(nvml_library: str):
    """pynvml, initialised once per process (a failed start is tried again at the
    next read; reads run one at a time)."""
    import ctypes
    import pynvml
    if not _NVML_STARTED:
        if nvml_library:
            ctypes.CDLL(nvml_library, mode=os.RTLD_GLOBAL)
        pynvml.nvmlInit()
        _NVML_STARTED.append(nvml_library)
    return pynvml


def read_driver(nvml_library: str, into: DriverReading) -> None:
    """Lists the GPUs, then reads each physical GPU's memory, utilisation and
    processes into `into` (one GPU at a time, so a deadline keeps those done)."""
    from ..node import discovery
    pynvml = _nvml(nvml_library)
    into.inventory = discovery.load_gpus(nvml_library)
    # an older driver lacks some versions of a call: pynvml says so in an error of its own
    unanswered = (pynvml.NVMLError, getattr(pynvml, "NVMLLibraryMismatchError", pynvml.NVMLError))
    for gpu in into.inventory:
        if gpu.is_mig:
            continue  # its GPU's figures are the card's
        handle = pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
        used = pynvml.nvmlDeviceGetMemoryInfo(handle).used
        try:
            util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
        except unanswered:
            util = None
        processes: Dict[int, int] = {}
        for query in (pynvml.nvmlDeviceGetComputeRunningProcesses,
                      pynvml.nvmlDeviceGetGraphicsRunningProcesses):
            try:
                found = query(handle)
            except unanswered:  # a driver without graphics process lists
                continue
            for proc in found:
                processes[proc.pid] = max(processes.get(proc.pid, 0), proc.usedGpuMemory or 0)
        into.figures[gpu.uuid] = DriverGpu(gpu.uuid, used, util, processes)


class DriverReader:
    """Reads the driver in a worker thread and waits for it at most `deadline_s`.
    One worker at a time: a read that finds one at work waits for it, within
    what is left of that worker's deadline, and takes its result (two scrapes at
    once share one read); a worker stuck in the driver past its deadline is
    never joined by another, and reads answer at once that the driver has not
    answered. The last inventory read is kept, so the GPUs are still named
    while the driver is not."""

    def __init__(self, nvml_library: str = "", deadline_s: float = DRIVER_DEADLINE_S,
                 read=read_driver):
        self.nvml_library = nvml_library
        self.deadline_s = deadline_s
        self._read = read
        self._lock = threading.Lock()
        self._current = None  # (started, reading, done) of the worker at work
        self.inventory: List[GpuInfo] = []

    def _start(self):
        reading, done = DriverReading(), threading.Event()
        current = (time.monotonic(), reading, done)

        def work():
            try:
                self._read(self.nvml_library, reading)
            except Exception as exc:  # NVML's errors, a library that does not load
                reading.error = f"NVML: {exc}"
            finally:
                with self._lock:
                    self._current = None
                done.set()

        self._current = current
        threading.Thread(target=work, name="hami-nvml", daemon=True).start()
        return current

    def read(self) -> DriverReading:
        asked = time.monotonic()
        with self._lock:
            started, reading, done = self._current or self._start()
        answered = done.wait(max(0.0, started + self.deadline_s - time.monotonic()))
        result = DriverReading(list(reading.inventory), dict(reading.figures), reading.error,
                               time.monotonic() - asked)
        if not answered:
            result.figures = {} if started < asked else result.figures
            result.error = (f"the driver did not answer within {self.deadline_s:g}s"
                            if started >= asked else f"the driver has not answered a read "
                            f"started {asked - started:.1f}s ago")
        if result.inventory:
            self.inventory = result.inventory
        return result


# ---- per GPU -------------------------------------------------------------------

@dataclass
class Holder:
    """One container's allocation on a GPU."""
    name: str
    id: str
    runc_root: str
    memory_mib: int
    cores: int
    pod_namespace: str = ""
    pod_name: str = ""
    container_name: str = ""
    request_source: str = ""


@dataclass
class GpuView:
    gpu: str  # "0", or "0:1" for a MIG instance
    index: int
    uuid: str
    model: str = ""  # "" where only the allocator names the GPU
    parent: str = ""
    mig_mode: bool = False
    memory_bytes: Optional[int] = None  # physical; None: not known
    capacity_bytes: Optional[int] = None  # what the allocator may promise (x memory_scaling)
    cores_capacity_pct: Optional[int] = None
    slots: Optional[int] = None
    memory_promised_bytes: int = 0
    cores_promised_pct: int = 0
    containers: int = 0
    invalid_entries: int = 0  # invalid allocator entries that name it (they block it)
    holders: List[Holder] = field(default_factory=list)
    allocator_error: str = ""
    driver_read: bool = False
    driver_error: str = ""
    driver_used_bytes: Optional[int] = None
    utilization_pct: Optional[int] = None
    outside_bytes: Optional[int] = None
    outside_pids: List[int] = field(default_factory=list)


def container_pids(state_dir: str, allocator: AllocatorView, containers: Iterable) -> set:
    """Host pids of every process a container's region counts, and of every
    container's first process."""
    from ..lifecycle.node_state import state_layout
    pids = {p.host_pid for c in containers for p in c.processes
            if p.host_pid > 0 and p.alive is not False}
    for name, entry in allocator.entries.items():
        try:
            pid = state_layout.container_pid(state_dir, name, entry)
        except Exception:  # a pid file the container could not have made, but unreadable
            pid = 0
        if isinstance(pid, int) and pid > 0:
            pids.add(pid)
    return pids


def gpu_views(inventory: List[GpuInfo], allocator: AllocatorView, driver: DriverReading,
              in_slices: set, split_count: int, memory_scaling: float) -> List[GpuView]:
    """One view per GPU the inventory lists (and per GPU only the allocator names)."""
    from ..lifecycle.node_state import allocator as alloc
    views: Dict[str, GpuView] = {}
    for gpu in inventory:
        cap = alloc.capacity(gpu, split_count, memory_scaling)
        views[gpu.uuid] = GpuView(
            gpu=gpu.name, index=gpu.index, uuid=gpu.uuid, model=gpu.model, parent=gpu.parent,
            mig_mode=gpu.mig_mode, memory_bytes=gpu.memory_mib * MiB, capacity_bytes=cap.mem_mib * MiB,
            cores_capacity_pct=0 if gpu.mig_mode else cap.cores, slots=cap.slots)
    for name, entry in sorted(allocator.entries.items()):
        meta = container_meta(entry)
        for d in entry["devices"]:
            view = views.setdefault(d["uuid"], GpuView(gpu=str(d["index"]), index=d["index"],
                                                       uuid=d["uuid"]))
            view.memory_promised_bytes += d["mem_mib"] * MiB
            view.cores_promised_pct += d["cores"]
            view.containers += 1
            view.holders.append(Holder(name, entry["id"], entry["runc_root"], d["mem_mib"],
                                       d["cores"], **meta))
    for bad in allocator.invalid.values():
        entry = bad.get("entry") if isinstance(bad, dict) else None
        devices = entry.get("devices") if isinstance(entry, dict) else None
        for d in devices if isinstance(devices, list) else ():
            if isinstance(d, dict) and d.get("uuid") in views:
                views[d["uuid"]].invalid_entries += 1
    for view in views.values():
        view.allocator_error = allocator.error
        figures = driver.figures.get(view.uuid)
        if view.parent:  # a MIG instance: the driver's figures are its GPU's
            view.driver_read = view.parent in driver.figures
            view.driver_error = "" if view.driver_read else driver.error or "the driver was not read"
            continue
        if figures is None:
            view.driver_error = driver.error or (
                "the driver does not list this GPU" if driver.inventory else "the driver was not read")
            continue
        view.driver_read = True
        view.driver_used_bytes = figures.used_bytes
        view.utilization_pct = figures.utilization_pct
        outside = {pid: used for pid, used in figures.processes.items() if pid not in in_slices}
        view.outside_bytes = sum(outside.values())
        view.outside_pids = sorted(outside)
    return sorted(views.values(), key=lambda v: (v.index, v.parent != "", v.gpu))


def inventory_fallback(reader_inventory: List[GpuInfo], state_dir: str, nvml_library: str) -> List[GpuInfo]:
    """The GPUs when the driver did not list them now: the last list read, else
    what discovery last found for the runtime (its cache, read as it is)."""
    if reader_inventory:
        return reader_inventory
    from ..node import discovery_cache
    return discovery_cache.last_found(state_dir)


def settings(cfg) -> dict:
    """The config values the views need (tests pass a dict of their own)."""
    return {k: getattr(cfg, k) for k in ("state_dir", "nvml_library", "split_count",
                                         "memory_scaling", "policy", "core_policy")}


def node_now(settings: Mapping, reader: DriverReader, containers: list) -> List[GpuView]:
    """Every GPU's view now: the driver read (within the reader's deadline), the
    allocator's state and the containers' regions as given."""
    driver = reader.read()
    allocator = read_allocator(settings["state_dir"])
    inventory = driver.inventory or inventory_fallback(reader.inventory, settings["state_dir"],
                                                       settings["nvml_library"])
    return gpu_views(inventory, allocator, driver,
                     container_pids(settings["state_dir"], allocator, containers),
                     settings["split_count"], settings["memory_scaling"])


def driver_columns(cfg, found: List[GpuInfo], live: Dict[str, dict], invalid: Dict[str, dict],
                   containers: list) -> Dict[str, dict]:
    """For `hamictl gpus`: per GPU UUID, the driver's figures now (within the
    deadline), memory outside every slice and who holds the GPU (`containers`: what
    top.read_all found)."""
    reader = DriverReader(cfg.nvml_library)
    allocator = AllocatorView(live, invalid)
    views = gpu_views(found, allocator, reader.read(), container_pids(cfg.state_dir, allocator, containers),
                      cfg.split_count, cfg.memory_scaling)
    def mib(value):
        return None if value is None else value // MiB

    return {v.uuid: {"driver_read": v.driver_read, "driver_error": v.driver_error,
                     "driver_memory_used_mib": mib(v.driver_used_bytes),
                     "utilization_pct": v.utilization_pct, "memory_outside_mib": mib(v.outside_bytes),
                     "outside_pids": v.outside_pids,
                     "containers": [vars(h) for h in v.holders]} for v in views}
