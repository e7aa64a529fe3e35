"""`hamictl agent`: the node agent, which holds each GPU container to its slice
by the driver's own count (node/enforcement.py decides; this is its edge).

Every agent_interval_ms it reads
- the GPU containers: the allocator's records (read again only when the state
  file changes), each one's cgroup (found once from its first process, whose
  host pid the createRuntime hook recorded, through /proc/<pid>/cgroup; else
  from its spec's linux.cgroupsPath) and the host pids in it now
  (node/cgroups.py);
- the driver (NVML, in a worker thread within a deadline, as node_view reads
  it): per GPU the device memory each process holds, and each process's SM
  utilisation over the last second;
and acts as the node config says (memory_enforcement, sm_enforcement): kills
with a pidfd, checked to be the process decided on and still in the
container's cgroup; freezes and thaws with the cgroup's freezer. Each action is
one line in the runtime's log (and on stderr). Its state (node/agent_state.py)
is written atomically after every action and at least every WRITE_EVERY_S.

One agent runs per state dir (an flock on <state_dir>/agent/lock). Stopped
(SIGTERM, SIGINT), it thaws what it froze. NVML that cannot be read, a
container whose cgroup cannot be found: nothing is done about them (libvgpu
still holds what it holds), and one line says so.
"""
from __future__ import annotations

import fcntl
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import click

from .. import log
from ..files import boot_id, file_key, process_start
from ..node import agent_state, cgroups
from ..node.enforcement import (Container, Driver, Freeze, Kill, Policy, Record, Report, SECOND_NS, Slice,
                                SmOver, Thaw, decide)
from . import node_view, top

MiB = 1024 * 1024
SM_WINDOW_S = 1.0  # the utilisation window read from the driver
MAX_FREEZE_S = 5.0
WRITE_EVERY_S = 2.0
RETRY_CGROUP_S = 1.0  # a container whose cgroup was not found is looked for again after this
SUBTREE_EVERY_S = 5.0  # cgroups below a container's are listed again after this
LOCK_WAIT_S = 2.0


def policy_of(cfg) -> Policy:
    ms = 1_000_000
    return Policy(memory=cfg.memory_enforcement, memory_grace_ns=cfg.memory_grace_ms * ms,
                  sm=cfg.sm_enforcement, sm_grace_ns=cfg.sm_grace_ms * ms,
                  sm_tolerance_pct=float(cfg.sm_tolerance_pct), sm_window_ns=int(SM_WINDOW_S * SECOND_NS),
                  max_freeze_ns=int(MAX_FREEZE_S * SECOND_NS))


# ---- the driver -----------------------------------------------------------------

def _layout(struct, key: str, value: str) -> str:
    """A struct format that reads (key, value) from each entry of an array of `struct`."""
    import ctypes
    codes = {ctypes.c_uint: "I", ctypes.c_ulonglong: "Q", ctypes.c_ulong: "Q"}
    types = dict(struct._fields_)
    at_key, at_value = getattr(struct, key).offset, getattr(struct, value).offset
    after = at_value + ctypes.sizeof(types[value])
    return (f"={at_key}x{codes[types[key]]}{at_value - at_key - ctypes.sizeof(types[key])}x"
            f"{codes[types[value]]}{ctypes.sizeof(struct) - after}x")


class _Listing:
    """One NVML list call (a process list, the utilisation samples) into a buffer
    kept between reads, grown when the driver says it is too small; each entry
    read as (pid, figure) in one pass over the buffer."""

    def __init__(self, pynvml, names: Tuple[str, ...], struct, value: str):
        import ctypes
        self.pynvml, self.struct = pynvml, struct
        self.size = ctypes.sizeof(struct)
        self.format = _layout(struct, "pid", value)
        self.fn = None
        for name in names:  # the newest the driver has
            try:
                self.fn = pynvml._nvmlGetFunctionPointer(name)
                break
            except pynvml.NVMLError:
                continue
        self.buffer = (struct * 64)()

    def call(self, handle, *since) -> List[Tuple[int, int]]:
        """(pid, figure) of each entry the driver filled; NVMLError where it did not answer."""
        import ctypes
        import struct
        pynvml = self.pynvml
        if self.fn is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        while True:
            count = ctypes.c_uint(len(self.buffer))
            if since:  # nvmlDeviceGetProcessUtilization(handle, samples, count, since)
                ret = self.fn(handle, self.buffer, ctypes.byref(count), ctypes.c_ulonglong(since[0]))
            else:  # nvmlDeviceGet*RunningProcesses(handle, count, infos)
                ret = self.fn(handle, ctypes.byref(count), self.buffer)
            if ret == pynvml.NVML_ERROR_INSUFFICIENT_SIZE and count.value > len(self.buffer):
                self.buffer = (self.struct * (count.value * 2))()
                continue
            if ret == pynvml.NVML_ERROR_NOT_FOUND and since:
                return []  # no process ran kernels in the window
            if ret != pynvml.NVML_SUCCESS:
                raise pynvml.NVMLError(ret)
            filled = memoryview(self.buffer).cast("B")[:count.value * self.size]
            return list(struct.iter_unpack(self.format, filled))


class _Worker:
    """One thread that reads the driver when asked; a tick waits for it at most
    the deadline and goes on without the driver after that. A worker stuck in the
    driver is not asked again until it answers (as node_view.DriverReader)."""

    def __init__(self, read: Callable[[dict], None], deadline_s: float):
        self._read, self.deadline_s = read, deadline_s
        self._asked, self._answered = threading.Event(), threading.Event()
        self._result: Tuple[dict, str] = ({}, "")
        self._since: Optional[float] = None  # when the read under way was asked for
        threading.Thread(target=self._loop, name="hami-agent-nvml", daemon=True).start()

    def _loop(self) -> None:
        while True:
            self._asked.wait()
            self._asked.clear()
            figures: dict = {}
            try:
                self._read(figures)
                error = ""
            except Exception as exc:  # NVML's errors, a library that does not load
                error = f"NVML: {exc}"
            self._result = (figures, error)
            self._answered.set()

    def read(self) -> Tuple[dict, str]:
        now = time.monotonic()
        if self._since is not None and not self._answered.is_set():
            return {}, f"the driver has not answered a read started {now - self._since:.1f}s ago"
        self._since = now
        self._answered.clear()
        self._asked.set()
        if not self._answered.wait(self.deadline_s):
            return {}, f"the driver did not answer within {self.deadline_s:g}s"
        self._since = None
        return self._result


class DriverSource:
    """Per GPU, the memory each process holds and its SM use over the window, read
    through NVML (node_view's NVML, started once) in a worker thread within a
    deadline."""

    def __init__(self, nvml_library: str, deadline_s: float = node_view.DRIVER_DEADLINE_S):
        self.nvml_library = nvml_library
        self.uuids: Tuple[str, ...] = ()
        self.handles: Dict[str, object] = {}
        self.lists: Optional[Tuple[_Listing, ...]] = None
        self.worker = _Worker(self._read, deadline_s)

    def _listings(self, pynvml) -> Tuple[_Listing, ...]:
        if self.lists is None:
            info = pynvml.c_nvmlProcessInfo_v3_t  # the layout of v2 and v3 alike
            self.lists = (
                _Listing(pynvml, ("nvmlDeviceGetComputeRunningProcesses_v3",
                                  "nvmlDeviceGetComputeRunningProcesses_v2"), info, "usedGpuMemory"),
                _Listing(pynvml, ("nvmlDeviceGetGraphicsRunningProcesses_v3",
                                  "nvmlDeviceGetGraphicsRunningProcesses_v2"), info, "usedGpuMemory"),
                _Listing(pynvml, ("nvmlDeviceGetProcessUtilization",),
                         pynvml.c_nvmlProcessUtilizationSample_t, "smUtil"))
        return self.lists

    def _read(self, into: dict) -> None:
        pynvml = node_view._nvml(self.nvml_library)
        compute, graphics, utilisation = self._listings(pynvml)
        unknown = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
        since_us = int((time.time() - SM_WINDOW_S) * 1e6)
        for uuid in self.uuids:
            handle = self.handles.get(uuid)
            if handle is None:
                handle = self.handles[uuid] = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            memory: Dict[int, int] = {}
            for listing in (compute, graphics):
                if listing.fn is None:
                    continue  # a driver without it (graphics lists)
                for pid, used in listing.call(handle):
                    used = 0 if used == unknown else used
                    if used > memory.get(pid, -1):
                        memory[pid] = used
            sm: Optional[Dict[int, float]]
            try:
                samples: Dict[int, List[int]] = {}
                for pid, util in utilisation.call(handle, since_us):
                    samples.setdefault(pid, []).append(util)
                sm = {pid: sum(values) / len(values) for pid, values in samples.items()}
            except pynvml.NVMLError:
                sm = None  # not read: no SM figures this tick
            into[uuid] = (memory, sm)

    def read(self, uuids) -> Tuple[Driver, str]:
        self.uuids = tuple(uuids)
        if not self.uuids:
            return Driver(), ""
        figures, error = self.worker.read()
        memory = {u: f[0] for u, f in figures.items()}
        sm = {u: f[1] for u, f in figures.items() if f[1] is not None}
        missing = [u for u in self.uuids if u not in memory]
        error = error or (f"the driver does not list {', '.join(missing)}" if missing else "")
        return Driver(memory, sm), error


# ---- the containers --------------------------------------------------------------

@dataclass
class Known:
    """What the agent found out about a container once (and when)."""
    entry: dict
    slices: Tuple[Slice, ...] = ()  # its GPUs (MIG instances left to the hardware)
    pid: int = 0
    cgroup: Optional[cgroups.Cgroup] = None
    looked: float = -1e9  # monotonic s of the last search for its cgroup
    listed: float = -1e9  # monotonic s of the last listing of the cgroups below it
    why: str = ""  # why no cgroup was found ("stopped": its first process is gone, nothing to say)
    misses: int = 0  # looks in a row that found no cgroup (a create in flight has no pid yet)


class Containers:
    """The GPU containers of a state dir, each with its cgroup."""

    def __init__(self, state_dir: str, mountinfo: str = "/proc/self/mountinfo", proc: str = "/proc"):
        self.state_dir = state_dir
        self.proc = proc
        self.mounts = cgroups.mounts(mountinfo)
        self.own = cgroups.of_process(os.getpid(), proc)
        self.known: Dict[str, Known] = {}
        self.uuids: List[str] = []  # the GPUs they hold, MIG instances aside
        self._key = None

    def _entries(self) -> Dict[str, dict]:
        from ..lifecycle.node_state import store
        path = os.path.join(self.state_dir, store.STATE_FILE)
        try:
            key = file_key(path, os.stat(path))
        except OSError:
            key = None
        if key != self._key:
            self._key = key
            view = node_view.read_allocator(self.state_dir, alive=lambda entry: True)
            entries = {n: e for n, e in view.entries.items()
                       if any(not d["uuid"].startswith("MIG-") for d in e["devices"])}
            known = {n: self.known[n] if n in self.known and self.known[n].entry == e else Known(
                e, tuple(Slice(d["uuid"], d["mem_mib"] * MiB, d["cores"]) for d in e["devices"]
                         if not d["uuid"].startswith("MIG-"))) for n, e in entries.items()}
            for name, old in self.known.items():
                if old.cgroup is not None and known.get(name) is not old:
                    old.cgroup.close()
            self.known = known
            self.uuids = sorted({s.uuid for k in known.values() for s in k.slices})
        return {n: k.entry for n, k in self.known.items()}

    def _first_process(self, name: str, entry: dict) -> Tuple[int, str]:
        """(the container's first process on the host, why not: 0 and "stopped"
        where it is gone or runc's state says the process with that pid is no
        longer it, 0 and a reason where no pid is recorded)."""
        from ..lifecycle.node_state import state_layout, store
        pid = state_layout.container_pid(self.state_dir, name, entry)
        if pid <= 0:
            return 0, "no host pid recorded for its first process"
        runc = store.read_json(os.path.join(entry["runc_root"], entry["id"], "state.json"),
                               store.MAX_STATE_BYTES)
        start = process_start(pid)
        if start is None or isinstance(runc, dict) and runc.get("init_process_pid") == pid and \
                runc.get("init_process_start") != start:
            return 0, "stopped"
        return pid, ""

    def _spec_path(self, entry: dict) -> str:
        try:
            with open(os.path.join(entry["bundle"], "config.json"), "rb") as handle:
                spec = json.loads(handle.read(4 << 20))
            return spec["linux"]["cgroupsPath"]
        except (OSError, ValueError, KeyError, TypeError):
            return ""

    def cgroup(self, name: str, now: float) -> Optional[cgroups.Cgroup]:
        known = self.known[name]
        if known.cgroup is not None:
            if now - known.listed >= SUBTREE_EVERY_S:
                known.cgroup.list_below()
                known.listed = now
            return known.cgroup
        if now - known.looked < RETRY_CGROUP_S:
            return None
        known.looked = now
        known.pid, known.why = self._first_process(name, known.entry)
        found = None
        if known.pid:
            found = cgroups.locate(cgroups.of_process(known.pid, self.proc), self.mounts, self.own)
            if found is None:
                known.why = (f"its first process (host pid {known.pid}) is in no cgroup of its own "
                             "(the host's, or one the agent is in too)")
        if found is None and known.why != "stopped":
            found = cgroups.from_spec_path(self._spec_path(known.entry), self.mounts, self.own)
        known.cgroup = found
        known.misses = 0 if found is not None or known.why == "stopped" else known.misses + 1
        if found is not None:
            found.list_below()
            known.listed, known.why = now, ""
        return found

    def processes(self, name: str, now: float) -> Tuple[Optional[cgroups.Cgroup], set]:
        """The container's cgroup and the host pids in it now (a cgroup removed
        since it was found is looked for again)."""
        cg = self.cgroup(name, now)
        pids = cgroups.processes(cg) if cg is not None else set()
        if pids is None:
            cg.close()
            known = self.known[name]
            known.cgroup, known.looked = None, -1e9
            cg = self.cgroup(name, now)
            pids = (cgroups.processes(cg) if cg is not None else None) or set()
        return cg, pids

    def read(self, now: float) -> List[Tuple[str, dict, Optional[cgroups.Cgroup], set]]:
        """(name, entry, cgroup, host pids in it) of every GPU container now."""
        out = []
        self._entries()
        for name, known in self.known.items():
            cg = known.cgroup
            if cg is not None and not cg.below and now - known.listed < SUBTREE_EVERY_S:
                pids = cgroups.pids_of(cg)  # the common case: one cgroup, its file open
                if pids is not None:
                    out.append((name, known.entry, cg, pids))
                    continue
            cg, pids = self.processes(name, now)
            out.append((name, known.entry, cg, pids))
        return out


# ---- the agent -------------------------------------------------------------------

def _mib(value: int) -> str:
    return f"{value / MiB:.0f} MiB"


@dataclass
class Agent:
    cfg: object
    state_dir: str
    containers: Containers
    driver: DriverSource
    policy: Policy
    clock: Callable[[], int] = time.monotonic_ns
    say: Callable[[str, str], None] = lambda level, line: None  # (level, line): the log and stderr
    records: Dict[str, Record] = field(default_factory=dict)
    totals: Dict[str, int] = field(default_factory=dict)
    wall: Dict[str, float] = field(default_factory=dict)
    starts: Dict[int, Optional[int]] = field(default_factory=dict)
    driver_error: str = ""
    written: float = 0.0
    unfound: set = field(default_factory=set)

    def resume(self, state: Optional[agent_state.AgentState]) -> None:
        """What an earlier agent on this state dir kept (the same boot only)."""
        if state is None:
            return
        self.totals = dict(state.totals)
        if state.boot and state.boot == boot_id():
            self.records = dict(state.containers)
            self.wall = dict(state.wall)

    def _start(self, pid: int) -> Optional[int]:
        if pid not in self.starts:
            self.starts[pid] = process_start(pid)
        return self.starts[pid]

    def tick(self) -> List:
        now_ns = self.clock()
        now = now_ns / SECOND_NS
        found = self.containers.read(now)
        driver, error = self.driver.read(self.containers.uuids)
        if error != self.driver_error:
            self.say("warning" if error else "info", f"agent: the driver was not read: {error}" if error
                     else "agent: the driver is read again")
            self.driver_error = error
        holders = {pid for table in driver.memory.values() for pid in table}
        seen, facts, cgs = set(), [], {}
        known_now = self.containers.known
        for name, entry, cg, pids in found:
            known = known_now[name]
            if cg is None and known.misses >= 3 and name not in self.unfound:
                self.unfound.add(name)
                self.say("warning", f"agent: container {self._who(name)}: its cgroup was not found "
                         f"({known.why}): not enforced")
            elif cg is not None and name in self.unfound:
                self.unfound.discard(name)
            mine = pids & holders
            starts = {}
            if mine:
                seen |= mine
                starts = {pid: start for pid in mine if (start := self._start(pid)) is not None}
            facts.append(Container(name, known.slices, pids, known.pid, starts,
                                   entry.get("core_policy", "default")))
            cgs[name] = cg
        for pid in [p for p in self.starts if p not in seen]:
            del self.starts[pid]
        actions, self.records = decide(now_ns, facts, driver, self.policy, self.records)
        for action in actions:
            self._act(action, cgs.get(action.name), driver)
        if actions or time.time() - self.written >= WRITE_EVERY_S:
            self.write()
        return actions

    # ---- actions ----

    def _who(self, name: str) -> str:
        known = self.containers.known.get(name)
        cid = name.rpartition("@")[0]
        shown = node_view.shown_name(node_view.container_meta(known.entry if known else None))
        return f"{cid} (pod {shown})" if shown != "-" else cid

    def _over_text(self, over) -> str:
        if isinstance(over, SmOver):
            users = ", ".join(f"pid {pid} {pct:.0f}%" for pid, pct in over.users) or "none"
            return (f"uses {over.use_pct:.0f}% of the SMs of {over.uuid} (share {over.share_pct}%) for "
                    f"{over.over_ns / SECOND_NS:.1f} s: the driver shows {users}")
        holders = ", ".join(f"pid {pid} {_mib(used)}" for pid, used in over.holders) or "none"
        return (f"holds {_mib(over.held_bytes)} of {over.uuid} (slice {_mib(over.limit_bytes)}) for "
                f"{over.over_ns / SECOND_NS:.1f} s: the driver shows {holders}")

    def _count(self, action: str, times: int = 1) -> None:
        self.totals[action] = self.totals.get(action, 0) + times

    def _act(self, action, cg: Optional[cgroups.Cgroup], driver: Driver) -> None:
        who = self._who(action.name)
        self.wall[action.name] = time.time()
        if isinstance(action, Kill):
            done = [self._kill(pid, start, cg) for pid, start in action.victims]
            self._count("kill", len(action.victims))
            what = "; ".join(self._over_text(o) for o in action.overs)
            self.say("warning", f"agent: container {who} {what}; policy kill: " + ", ".join(done)
                     + (" (its first process: nothing else held memory)" if action.init_killed else ""))
        elif isinstance(action, Report):
            self._count("log")
            what = "; ".join(self._over_text(o) for o in action.overs)
            self.say("warning", f"agent: container {who} {what}; policy log: nothing done")
        elif isinstance(action, Freeze):
            self._count("freeze")
            what = "; ".join(self._over_text(o) for o in action.overs)
            result = self._freeze(action, cg)
            self.say("warning", f"agent: container {who} {what}; policy freeze: {result}")
        elif isinstance(action, Thaw):
            result = self._thaw(cg)
            self.say("info", f"agent: container {who}: {result}")

    def _kill(self, pid: int, start: int, cg: Optional[cgroups.Cgroup]) -> str:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return f"pid {pid} gone already"
        except OSError as exc:
            return f"pid {pid} not killed: {exc.strerror}"
        try:
            if start and process_start(pid) != start:
                return f"pid {pid} not killed: another process has its pid now"
            if cg is None or pid not in (cgroups.processes(cg) or ()):
                return f"pid {pid} not killed: no longer in the container's cgroup"
            signal.pidfd_send_signal(fd, signal.SIGKILL)
            return f"killed pid {pid}"
        except ProcessLookupError:
            return f"pid {pid} gone already"
        except OSError as exc:
            return f"pid {pid} not killed: {exc.strerror}"
        finally:
            os.close(fd)

    def _freeze(self, action: Freeze, cg: Optional[cgroups.Cgroup]) -> str:
        rec = self.records[action.name]
        seconds = action.duration_ns / SECOND_NS
        if cg is None or not cg.freezer_kind:
            rec.frozen_until = 0
            return "not frozen: no freezer for its cgroup"
        if cgroups.frozen(cg):
            rec.frozen_until = 0
            return "not frozen: frozen already (paused), left as it is"
        try:
            cgroups.freeze(cg, True)
        except OSError as exc:
            rec.frozen_until = 0
            return f"not frozen: {exc.strerror}"
        return f"frozen for {seconds:.1f} s ({cg.freezer_kind} freezer)"

    def _thaw(self, cg: Optional[cgroups.Cgroup]) -> str:
        if cg is None:
            return "its cgroup is gone: nothing to thaw"
        try:
            cgroups.freeze(cg, False)
        except OSError as exc:
            return f"not thawed: {exc.strerror}"
        return "thawed"

    def thaw_all(self) -> None:
        """What the agent froze, thawed (it stops: no container stays frozen by it)."""
        for name, rec in self.records.items():
            if rec.frozen_until and name in self.containers.known:
                cg = self.containers.known[name].cgroup
                rec.frozen_until = 0
                self.say("info", f"agent: container {self._who(name)}: {self._thaw(cg)} (the agent stops)")

    def write(self) -> None:
        pid = os.getpid()
        state = agent_state.AgentState(
            pid=pid, start=process_start(pid), boot=boot_id(), updated=time.time(),
            interval_ms=self.cfg.agent_interval_ms,
            policy={"memory": self.policy.memory, "sm": self.policy.sm}, driver_error=self.driver_error,
            totals=dict(self.totals), containers=self.records,
            wall={n: t for n, t in self.wall.items() if n in self.records})
        try:
            agent_state.write(self.state_dir, state)
        except OSError as exc:
            self.say("error", f"agent: state not written: {exc}")
        self.written = state.updated


# ---- the command -----------------------------------------------------------------

def take_lock(state_dir: str, wait_s: float = LOCK_WAIT_S) -> int:
    """An fd holding the agent's lock of the state dir; 0 where another agent holds it."""
    os.makedirs(agent_state.agent_dir(state_dir), mode=0o700, exist_ok=True)
    fd = os.open(agent_state.lock_path(state_dir), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    until = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= until:
                os.close(fd)
                return 0
            time.sleep(0.05)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def holder(state_dir: str) -> int:
    """The pid of the agent that holds the state dir's lock now; 0 where none does."""
    try:
        fd = os.open(agent_state.lock_path(state_dir), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return 0
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.read(fd, 32).strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return 0
    finally:
        os.close(fd)


@click.command("agent")
@top.state_dir_option
@click.option("--driver-timeout", type=click.FloatRange(min=0.05, max=5.0),
              default=node_view.DRIVER_DEADLINE_S, show_default=True,
              help="seconds a tick waits for the driver before it goes on without it")
@click.option("--ticks", type=click.IntRange(min=1), default=None, hidden=True,
              help="stop after this many ticks (tests)")
@click.pass_context
def agent_command(ctx, state_dir: Optional[str], driver_timeout: float, ticks: Optional[int]):
    """Hold each GPU container to its slice by the driver's count, until SIGTERM/SIGINT."""
    from .. import config
    from ..errors import HamiError
    from ..lifecycle.node_state import state_layout
    try:
        cfg = config.load(ctx.find_root().obj.get("config_path"))
        state_dir = state_dir or cfg.state_dir
        state_layout.make_state_dir(state_dir)
    except HamiError as exc:
        raise click.ClickException(exc.line()) from None

    def say(level: str, line: str) -> None:
        log.write(cfg, level, line)
        click.echo(f"hamictl {line}", err=True)

    lock = take_lock(state_dir)
    if not lock:
        raise click.ClickException(f"agent: another agent runs on {state_dir} (pid {holder(state_dir)})")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    agent = Agent(cfg, state_dir, Containers(state_dir), DriverSource(cfg.nvml_library, driver_timeout),
                  policy_of(cfg), say=say)
    agent.resume(agent_state.read(state_dir))
    say("info", f"agent: pid {os.getpid()} holds the GPU containers of {state_dir} to their slices every "
        f"{cfg.agent_interval_ms} ms (memory: {cfg.memory_enforcement} after {cfg.memory_grace_ms} ms, "
        f"SM: {cfg.sm_enforcement} after {cfg.sm_grace_ms} ms)")
    interval = cfg.agent_interval_ms / 1000
    done = 0
    import gc
    gc.freeze()  # what was loaded to start is never collected: each collection scans only a tick's garbage
    try:
        while not stop.is_set():
            started = time.monotonic()
            agent.tick()
            done += 1
            if ticks is not None and done >= ticks:
                break
            thaws = [r.frozen_until / SECOND_NS for r in agent.records.values() if r.frozen_until]
            wake = min([started + interval] + thaws)
            stop.wait(max(0.0, wake - time.monotonic()))
    finally:
        agent.thaw_all()
        agent.write()
        say("info", f"agent: pid {os.getpid()} stops")
        os.close(lock)
    sys.stderr.flush()
