"""`hamictl top`: live GPU use per container, read from the shared regions.

Each container the runtime gave a GPU has its limits (<state_dir>/private/<id>@<root key>/limits)
and its region (<state_dir>/containers/<id>@<root key>/vgpu.region), where libvgpu keeps its
counters; both are opened as lifecycle/node_state/container_files.py says (never through a link the
container planted; a region it replaced is shown as that container's error). Memory is read as it is; SM use is the
measured kernel time over a short interval (two reads `interval` apart), and a
container is "throttled" / "paused" when its launches spent time in that interval
waiting for its SM share / for high-priority work. Two runc roots may hold the
same container id: the root (its path from the allocator state, else the root
key) tells them apart.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import click

from . import display_text, json_output

MiB = 1024 * 1024


@dataclass
class DeviceView:
    index: int
    uuid: str
    mem_used_bytes: int
    mem_limit_bytes: int
    sm_limit_pct: int
    sm_busy_ns: int
    sm_throttled_ns: int = 0  # cumulative time launches waited for the SM share
    sm_paused_ns: int = 0  # cumulative time launches waited for high-priority work
    # None until two samples exist
    sm_use_pct: Optional[float] = None  # measured share of the GPU over the interval
    throttled_now: Optional[bool] = None  # launches waited for the share in the interval
    paused_now: Optional[bool] = None  # launches waited for high-priority work in the interval


@dataclass
class ProcessView:
    pid: int
    host_pid: int
    mem_used_bytes: List[int]
    ctx_used_bytes: List[int]
    sm_busy_ns: List[int]
    launches: List[int]
    sm_use_pct: List[Optional[float]] = field(default_factory=list)
    # False: exited, its slot not yet reclaimed (its memory still counts against the
    # limit until a process of the container reclaims it); None: host pid unknown.
    alive: Optional[bool] = None

    def uses(self, device: int) -> bool:
        return self.alive is not False and bool(self.mem_used_bytes[device] or self.launches[device])


@dataclass
class ContainerView:
    id: str
    region: str
    name: str = ""  # the allocation's name, <id>@<root key>
    root_key: str = ""  # "" for a dir not named <id>@<root key>
    runc_root: str = ""  # from the allocator state; "" when it does not say
    core_policy: str = ""
    priority: int = 1
    devices: List[DeviceView] = field(default_factory=list)
    processes: List[ProcessView] = field(default_factory=list)
    error: str = ""  # why the region could not be read
    # from the allocator record ("" where the engine did not say): node_view.container_meta
    pod_namespace: str = ""
    pod_name: str = ""
    container_name: str = ""
    request_source: str = ""


def region_module():
    """hami_runtime.region, loaded (it reads region.h) only when regions are read, so a
    missing header is one clear line here, not a failure of every hamictl command."""
    try:
        from ..node import region
    except Exception as exc:  # the header's RegionError, or an unreadable header
        raise click.ClickException(str(exc)) from None
    return region


def region_files(state_dir: str) -> Dict[str, str]:
    """allocation name (<id>@<root key>) -> its region's path, for every container
    whose region the runtime has made (a create still writing it is left out; a
    region removed from inside is not, and shows as that container's error); a
    symlinked containers/ is not read."""
    from ..lifecycle.node_state import container_files, state_layout, store
    region = region_module()
    try:
        names = state_layout.subdir_names(state_dir, "containers")
    except store.HamiError:
        return {}
    base = os.path.join(state_dir, "containers")
    found = {}
    for name in names:
        try:
            made = container_files.region_identity(state_dir, name) is not None
        except store.HamiError:  # not an allocation's name
            made = False
        if made:
            found[name] = os.path.join(base, name, region.REGION_FILE_NAME)
    return found


def allocator_records(state_dir: str) -> Dict[str, dict]:
    """allocation name -> its record as the allocator state has it, read without
    its lock (the file is replaced atomically) and without its checks (each
    field read is checked where it is used). {} when the state cannot be read."""
    from ..files import read_state_file
    from ..lifecycle.node_state import store
    try:
        data = json.loads(read_state_file(os.path.join(state_dir, store.STATE_FILE),
                                          store.MAX_STATE_BYTES))
    except (OSError, ValueError, store.HamiError):
        return {}
    entries = data.get("allocations") if isinstance(data, dict) else None
    return {name: entry for name, entry in (entries.items() if isinstance(entries, dict) else ())
            if isinstance(entry, dict)}


def runc_roots(state_dir: str, records: Optional[Dict[str, dict]] = None) -> Dict[str, str]:
    """allocation name -> runc root, as the allocator state says; a root is taken
    only where it hashes to the name's root key."""
    from ..lifecycle.node_state import state_layout
    records = allocator_records(state_dir) if records is None else records
    roots = {}
    for name, entry in records.items():
        root = entry.get("runc_root")
        if isinstance(root, str) and os.path.isabs(root) and \
                split_name(name)[1] == state_layout.root_key(root):
            roots[name] = root
    return roots


def split_name(name: str) -> Tuple[str, str]:
    """(container id, root key) of a container dir's name; a name that is not a
    well-formed allocation name is all id."""
    from ..lifecycle.node_state import state_layout, store
    try:
        return state_layout.check_name(name)
    except store.HamiError:
        return name, ""


def read_container(state_dir: str, name: str, path: str, runc_root: str = "") -> ContainerView:
    from ..lifecycle.node_state import container_files, store
    region = region_module()
    cid, key = split_name(name)
    view = ContainerView(id=cid, region=path, name=name, root_key=key, runc_root=runc_root)
    try:
        with container_files.opened(state_dir, name) as (limits, r):
            view.core_policy, view.priority = limits.core_policy, limits.priority
            devices = limits.devices
            for i, limit in enumerate(devices):
                sm = r.sm_times(i)
                view.devices.append(DeviceView(i, limit.uuid, r.used_bytes(i), limit.mem_limit_bytes,
                                               limit.sm_limit_pct, sm.busy_ns, sm.throttled_ns,
                                               sm.paused_ns))
            for proc, alive in container_files.processes(state_dir, name, r, len(devices)):
                view.processes.append(ProcessView(
                    pid=proc.pid, host_pid=proc.host_pid,
                    mem_used_bytes=[d.mem_used for d in proc.devices],
                    ctx_used_bytes=[d.ctx_used for d in proc.devices],
                    sm_busy_ns=[d.sm_busy_ns for d in proc.devices],
                    launches=[d.launches for d in proc.devices], alive=alive))
    except (region.RegionError, store.HamiError, OSError) as exc:
        view.error = str(exc)
    return view


def read_all(state_dir: str) -> List[ContainerView]:
    from . import node_view
    files = region_files(state_dir)
    records = allocator_records(state_dir) if files else {}
    roots = runc_roots(state_dir, records)
    views = []
    for name, path in files.items():
        view = read_container(state_dir, name, path, roots.get(name, ""))
        for key, value in node_view.container_meta(records.get(name)).items():
            setattr(view, key, value)
        views.append(view)
    return views


def _pct(busy_now: int, busy_before: int, elapsed_ns: int) -> Optional[float]:
    if elapsed_ns <= 0 or busy_now < busy_before:
        return None  # counters restarted (a slot reclaimed): no honest figure
    return round(100.0 * (busy_now - busy_before) / elapsed_ns, 1)


def sm_measured(container: ContainerView, device: DeviceView) -> bool:
    """libvgpu measures kernel time only where an SM limit is in force: a launch
    with none costs nothing, so nothing times it."""
    return 0 < device.sm_limit_pct < 100 and container.core_policy != "disable"


def add_rates(before: List[ContainerView], after: List[ContainerView], elapsed_ns: int) -> None:
    """Fills the rates in `after` from the counters' moves since `before`."""
    earlier = {c.region: c for c in before}
    for container in after:
        old = earlier.get(container.region)
        if old is None or old.error or container.error:
            continue
        for dev in container.devices:
            if dev.index < len(old.devices):
                prev = old.devices[dev.index]
                if sm_measured(container, dev):
                    dev.sm_use_pct = _pct(dev.sm_busy_ns, prev.sm_busy_ns, elapsed_ns)
                dev.throttled_now = dev.sm_throttled_ns > prev.sm_throttled_ns
                dev.paused_now = dev.sm_paused_ns > prev.sm_paused_ns
        old_procs = {(p.pid, p.host_pid): p for p in old.processes}
        for proc in container.processes:
            prev = old_procs.get((proc.pid, proc.host_pid))
            proc.sm_use_pct = [
                _pct(busy, prev.sm_busy_ns[d], elapsed_ns)
                if prev and d < len(prev.sm_busy_ns) and d < len(container.devices)
                and sm_measured(container, container.devices[d]) else None
                for d, busy in enumerate(proc.sm_busy_ns)]


class Sampler:
    """Successive views of the state dir, each with the rates measured since the
    one before (the first waits one interval for its own). The clock and the
    sleep are arguments, so tests can drive it without waiting."""

    def __init__(self, state_dir: str, clock: Optional[Callable[[], int]] = None,
                 sleep: Optional[Callable[[float], None]] = None):
        self.state_dir = state_dir
        self.clock = clock or time.monotonic_ns
        self.sleep = sleep or time.sleep
        self._last: Optional[Tuple[List[ContainerView], int]] = None

    def _read(self) -> Tuple[List[ContainerView], int]:
        return read_all(self.state_dir), self.clock()

    def next(self, interval: float) -> List[ContainerView]:
        """Views `interval` seconds after the last ones (0: now, with no rates)."""
        if interval <= 0:
            return self._read()[0]
        if self._last is None:
            self._last = self._read()
        self.sleep(interval)
        views, now = self._read()
        add_rates(self._last[0], views, now - self._last[1])
        self._last = (views, now)
        return views


# ---- rendering (pure) ------------------------------------------------------

def _mib(value: int) -> str:
    return f"{value / MiB:.0f}"


def _limit_mib(value: int) -> str:
    return _mib(value) if value else "-"


def _sm(c: ContainerView, d: DeviceView) -> str:
    if not sm_measured(c, d):
        used = "-"
    else:
        used = "?" if d.sm_use_pct is None else f"{d.sm_use_pct:.0f}%"
    cap = f"{d.sm_limit_pct}%" if 0 < d.sm_limit_pct < 100 else "-"
    return f"{used} / {cap}"


PRIORITIES = {0: "high", 1: "low"}


def _root(c: ContainerView) -> str:
    return c.runc_root or c.root_key or "-"


def _held(d: DeviceView) -> str:
    if d.throttled_now is None or d.paused_now is None:
        return "?"
    held = [word for word, now in (("paused", d.paused_now), ("throttled", d.throttled_now)) if now]
    return ",".join(held) or "-"


def _enforced(agent, c: ContainerView, uuid: str) -> tuple:
    """The ENFORCED cell of a device row where the node agent runs (none where it does not)."""
    if agent is None:
        return ()
    from ..node.enforcement import flags
    return (", ".join(flags(agent.containers.get(c.name), uuid)) or "-",)


def render_table(containers: List[ContainerView], agent=None, width: int = 0) -> str:
    """agent: the node agent's state where one runs (node/agent_state.current):
    a column says what it found of each container's device. width: fit that
    many columns (fit_columns); 0: every column in full."""
    if not containers:
        return "no GPU containers"
    extra = ("ENFORCED",) if agent is not None else ()
    blank = ("",) * len(extra)
    rows = [("CONTAINER", "ROOT", "DEV", "UUID", "POLICY", "PRIO", "MEMORY MiB (used / limit)",
             "SM (use / limit)", "HELD", "PROCS", "POD") + extra]
    for c in containers:
        if c.error:
            rows.append((c.id[:12], _root(c), "-", "-", "", "", c.error, "", "", "", pod_name(c)) + blank)
            continue
        for d in c.devices:
            procs = sum(1 for p in c.processes if p.uses(d.index))
            rows.append((c.id[:12], _root(c), str(d.index), d.uuid, c.core_policy,
                         PRIORITIES.get(c.priority, str(c.priority)),
                         f"{_mib(d.mem_used_bytes)} / {_limit_mib(d.mem_limit_bytes)}",
                         _sm(c, d), _held(d), str(procs), pod_name(c)) + _enforced(agent, c, d.uuid))
        for p in c.processes:
            host = str(p.host_pid) if p.host_pid else "?"
            state = ", exited" if p.alive is False else ""
            for i, used in enumerate(p.mem_used_bytes):
                if not used and not p.launches[i]:
                    continue
                use = p.sm_use_pct[i] if i < len(p.sm_use_pct) else None
                shown = "-" if i < len(c.devices) and not sm_measured(c, c.devices[i]) else \
                    "?" if use is None else f"{use:.0f}%"
                rows.append((f"  pid {p.pid} (host {host}{state})", "", str(i), "", "", "",
                             f"{_mib(used)} (context {_mib(p.ctx_used_bytes[i])})", shown, "",
                             f"{p.launches[i]} launches", "") + blank)
    return _columns(rows, width, TABLE_FITS)


# How a table is made narrower, step by step, until it fits the terminal:
# (header, what happens to it: a shorter header and cells cut to a length, or
# None: the column goes). Past the last step, lines are cut (never wrapped).
UUID_SHORT = 13  # "GPU-aaaaaaaa~": enough to tell a node's GPUs apart
TABLE_FITS = [
    ("UUID", ("UUID", UUID_SHORT)),
    ("MEMORY MiB (used / limit)", ("MEM MiB", None)),
    ("SM (use / limit)", ("SM", None)),
    ("ROOT", ("ROOT", 16)),
    ("UUID", None),
    ("ROOT", None),
    ("POLICY", None),
    ("PRIO", None),
    ("HELD", None),
    ("PROCS", None),
]
GPU_FITS = [
    ("UUID", ("UUID", UUID_SHORT)),
    ("MEMORY MiB (driver / promised / capacity)", ("MEM MiB drv/prom/cap", None)),
    ("MODEL", ("MODEL", 16)),
    ("UUID", None),
    ("MODEL", None),
    ("OUTSIDE MiB", ("OUT MiB", None)),
    ("CONTAINERS", ("CTRS", None)),
]


def _cut(cell: str, length: int) -> str:
    return cell if len(cell) <= length else cell[:length - 1] + "~"


def _laid_out(rows) -> List[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def fit_columns(rows, width: int, steps) -> List[str]:
    """The table's lines (rows[0] its header), at most `width` characters each
    where width > 0: each step in turn abbreviates or drops a column until the
    table fits; what still does not fit is cut at the edge, never wrapped."""
    lines = _laid_out(rows)
    if width <= 0:
        return lines
    for header, change in steps:
        if max(len(x) for x in lines) <= width:
            return lines
        if header not in rows[0]:
            continue
        at = rows[0].index(header)
        if change is None:
            rows = [row[:at] + row[at + 1:] for row in rows]
        else:
            short, length = change
            rows = [row[:at] + [short if n == 0 else _cut(row[at], length) if length else row[at]]
                    + row[at + 1:] for n, row in enumerate(rows)]
        lines = _laid_out(rows)
    return [x[:width].rstrip() for x in lines]


def _columns(rows, width: int = 0, steps=()) -> str:
    rows = [[display_text.one_line(cell) for cell in row] for row in rows]
    return "\n".join(fit_columns(rows, width, steps))


def pod_name(c) -> str:
    from .node_view import shown_name
    return shown_name(c)


def _opt_mib(value: Optional[int]) -> str:
    return "?" if value is None else _mib(value)


def render_gpus(gpus, width: int = 0) -> str:
    """The node's GPUs (node_view.GpuView): the driver's figures, what the allocator
    promised, capacity; memory outside every slice, with its processes. width:
    as for render_table."""
    if not gpus:
        return ""
    rows = [("GPU", "UUID", "MODEL", "MEMORY MiB (driver / promised / capacity)", "OUTSIDE MiB",
             "UTIL", "CORES", "CONTAINERS")]
    notes = []
    for g in gpus:
        promised = "?" if g.allocator_error else _mib(g.memory_promised_bytes)
        outside = "?" if g.outside_bytes is None else _mib(g.outside_bytes) + (
            f" (pid {', '.join(map(str, g.outside_pids))})" if g.outside_pids else "")
        rows.append((g.gpu, g.uuid, g.model or "?",
                     f"{_opt_mib(g.driver_used_bytes)} / {promised} / {_opt_mib(g.capacity_bytes)}",
                     outside, "?" if g.utilization_pct is None else f"{g.utilization_pct}%",
                     "?" if g.allocator_error else f"{g.cores_promised_pct}%",
                     "?" if g.allocator_error else f"{g.containers}/{'?' if g.slots is None else g.slots}"))
        if not g.driver_read and not g.parent:
            notes.append(f"GPU {g.gpu}: driver not read: {g.driver_error}")
        if g.allocator_error:
            notes.append(f"GPU {g.gpu}: allocator state not read: {g.allocator_error}")
    if width > 0:
        notes = [x[:width] for x in notes]
    return "\n".join([_columns(rows, width, GPU_FITS)] + notes)


def render_json(containers: List[ContainerView], interval: float, gpus=(), agent=None) -> str:
    """agent as for render_table: each container then has `enforcement`
    (node_view.enforcement_of), the document `agent` (its policy, totals)."""
    shown = [asdict(c) for c in containers]
    document = {"interval_s": interval, "containers": shown, "gpus": [asdict(g) for g in gpus]}
    if agent is not None:
        from .node_view import enforcement_of
        for view, c in zip(shown, containers):
            view["enforcement"] = enforcement_of(agent, c.name)
        document["agent"] = {"pid": agent.pid, "policy": agent.policy, "totals": agent.totals,
                             "driver_error": agent.driver_error}
    return json_output.dumps(document)


# ---- CLI edge ----------------------------------------------------------------

def state_dir_option(func):
    return click.option("--state-dir", type=click.Path(file_okay=False),
                        help="the runtime's state dir (default: from the config)")(func)


def node_settings(state_dir: Optional[str]) -> dict:
    """The config's values the node's views need (node_view.settings), the state
    dir --state-dir's where given."""
    from .. import config
    from ..errors import HamiError
    from . import node_view
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root().obj if ctx else None
    path = root.get("config_path") if isinstance(root, dict) else None
    try:
        values = node_view.settings(config.load(path, keep=False))
    except HamiError as exc:
        raise click.ClickException(exc.line()) from None
    if state_dir:
        values["state_dir"] = state_dir
    return values


def terminal_width() -> int:
    """The terminal's width where stdout is one (the table is fitted to it),
    else 0: every column in full for a pipe or a file."""
    import shutil
    if not sys.stdout.isatty():
        return 0
    return shutil.get_terminal_size().columns


class _Quit(Exception):
    """q was pressed."""


class QuitKey:
    """While --watch runs with stdin a terminal: stdin in cbreak mode (keys
    arrive unbuffered, not echoed; Ctrl-C still interrupts), its settings put
    back on exit. `wait(seconds)` sleeps, ending early with _Quit on q (or Q).
    With stdin not a terminal, a plain sleep."""

    def __init__(self, stream=None):
        self.fd = None
        self.saved = None
        stream = sys.stdin if stream is None else stream
        try:
            fd = stream.fileno()
        except (AttributeError, OSError, ValueError):
            return
        if not os.isatty(fd):
            return
        import termios
        import tty
        try:
            self.saved = termios.tcgetattr(fd)
            tty.setcbreak(fd, termios.TCSANOW)
        except termios.error:
            self.saved = None
            return
        self.fd = fd

    def wait(self, seconds: float) -> None:
        if self.fd is None:
            time.sleep(seconds)
            return
        import select
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    keys = os.read(self.fd, 64)
                except OSError:
                    keys = b""
                if not keys:  # the terminal went away: no more keys, a plain sleep
                    self.close()
                    time.sleep(max(0.0, end - time.monotonic()))
                    return
                if b"q" in keys or b"Q" in keys:
                    raise _Quit()

    def close(self) -> None:
        if self.fd is not None and self.saved is not None:
            import termios
            try:
                termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)
            except termios.error:
                pass
        self.fd = None


ONE_SHOT_INTERVAL = 0.5
WATCH_INTERVAL = 1.0


@click.command("top")
@state_dir_option
@click.option("--interval", type=click.FloatRange(min=0), default=None,
              help=f"seconds SM use and throttling are measured over, and with --watch between "
                   f"refreshes (default {ONE_SHOT_INTERVAL:g}, with --watch {WATCH_INTERVAL:g}; "
                   "0: memory only)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--watch", is_flag=True, help="refresh every interval until interrupted")
@click.option("--count", type=click.IntRange(min=1), default=None,
              help="with --watch: stop after this many refreshes")
@click.option("--width", type=click.IntRange(min=0), default=None,
              help="fit the tables to this many columns, abbreviating and dropping columns "
                   "(default: the terminal's width where output is a terminal; 0: every column in full)")
def top_command(state_dir, interval, as_json, watch, count, width):
    """Memory, SM use and throttling per GPU container and process; per GPU, the
    driver's figures against what the allocator promised. With --watch, q (or
    Ctrl-C) ends it."""
    if interval is None:
        interval = WATCH_INTERVAL if watch else ONE_SHOT_INTERVAL
    if watch and interval <= 0:
        raise click.BadParameter(f"{interval} must be above 0 with --watch", param_hint="--interval")
    from ..node import agent_state
    from . import node_view
    settings = node_settings(state_dir)
    clear = watch and not as_json and sys.stdout.isatty()
    width = terminal_width() if width is None else width
    keys = QuitKey() if watch else None
    sampler = Sampler(settings["state_dir"], sleep=keys.wait if keys else None)
    reader = node_view.DriverReader(settings["nvml_library"])
    shown = 0
    try:
        while True:
            containers = sampler.next(interval)
            gpus = node_view.node_now(settings, reader, containers)
            agent = agent_state.current(settings["state_dir"])
            if clear:
                click.echo("\033[H\033[J", nl=False)
            if as_json:
                click.echo(render_json(containers, interval, gpus, agent))
            else:
                display_text.echo("\n\n".join(x for x in (render_table(containers, agent, width),
                                                           render_gpus(gpus, width)) if x))
            shown += 1
            if not watch or (count is not None and shown >= count):
                return
    except (KeyboardInterrupt, _Quit):
        return
    finally:
        if keys is not None:
            keys.close()
