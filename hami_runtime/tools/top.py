"""`hamictl top`: live GPU use per container, read from the shared regions.

Each container the runtime gave a GPU has <state_dir>/containers/<id>@<root key>/vgpu.region;
libvgpu keeps its counters there. Memory is read as it is; SM use is the
measured kernel time over a short interval (two reads `interval` apart).
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

import click

MiB = 1024 * 1024


@dataclass
class DeviceView:
    index: int
    uuid: str
    mem_used_bytes: int
    mem_limit_bytes: int
    sm_limit_pct: int
    sm_busy_ns: int
    sm_use_pct: Optional[float] = None  # None until two samples exist


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
    core_policy: str = ""
    priority: int = 1
    devices: List[DeviceView] = field(default_factory=list)
    processes: List[ProcessView] = field(default_factory=list)
    error: str = ""  # why the region could not be read


def region_module():
    """hami_runtime.region, loaded (it reads region.h) only when regions are read, so a
    missing header is one clear line here, not a failure of every hamictl command."""
    try:
        from ..node import region
    except Exception as exc:  # the header's RegionError, or an unreadable header
        raise click.ClickException(str(exc)) from None
    return region


def region_files(state_dir: str) -> Dict[str, str]:
    """allocation name (<id>@<root key>) -> region file, for every container dir
    that has one; a symlinked containers/ is not read."""
    region = region_module()
    base = os.path.join(state_dir, "containers")
    try:
        names = [] if os.path.islink(base) else sorted(os.listdir(base))
    except FileNotFoundError:
        return {}
    found = {}
    for name in names:
        path = os.path.join(base, name, region.REGION_FILE_NAME)
        if os.path.isfile(path) and not os.path.islink(os.path.dirname(path)):
            found[name] = path
    return found


def read_container(cid: str, path: str) -> ContainerView:
    region = region_module()
    view = ContainerView(id=cid, region=path)
    try:
        with region.open(path) as r:
            view.core_policy, view.priority = r.core_policy, r.priority
            for i, limit in enumerate(r.devices):
                view.devices.append(DeviceView(i, limit.uuid, r.used_bytes(i), limit.mem_limit_bytes,
                                               limit.sm_limit_pct, r.sm_busy_ns(i)))
            for proc in r.processes():
                view.processes.append(ProcessView(
                    pid=proc.pid, host_pid=proc.host_pid,
                    mem_used_bytes=[d.mem_used for d in proc.devices],
                    ctx_used_bytes=[d.ctx_used for d in proc.devices],
                    sm_busy_ns=[d.sm_busy_ns for d in proc.devices],
                    launches=[d.launches for d in proc.devices], alive=proc.alive()))
    except (region.RegionError, OSError) as exc:
        view.error = str(exc)
    return view


def read_all(state_dir: str) -> List[ContainerView]:
    return [read_container(name.rpartition("@")[0] or name, path)
            for name, path in region_files(state_dir).items()]


def _pct(busy_now: int, busy_before: int, elapsed_ns: int) -> Optional[float]:
    if elapsed_ns <= 0 or busy_now < busy_before:
        return None  # counters restarted (a slot reclaimed): no honest figure
    return round(100.0 * (busy_now - busy_before) / elapsed_ns, 1)


def add_rates(before: List[ContainerView], after: List[ContainerView], elapsed_ns: int) -> None:
    """Fills sm_use_pct in `after` from the busy time measured since `before`."""
    earlier = {c.region: c for c in before}
    for container in after:
        old = earlier.get(container.region)
        if old is None or old.error or container.error:
            continue
        for dev in container.devices:
            if dev.index < len(old.devices):
                dev.sm_use_pct = _pct(dev.sm_busy_ns, old.devices[dev.index].sm_busy_ns, elapsed_ns)
        old_procs = {(p.pid, p.host_pid): p for p in old.processes}
        for proc in container.processes:
            prev = old_procs.get((proc.pid, proc.host_pid))
            proc.sm_use_pct = [
                _pct(busy, prev.sm_busy_ns[d], elapsed_ns) if prev and d < len(prev.sm_busy_ns) else None
                for d, busy in enumerate(proc.sm_busy_ns)]


def sample(state_dir: str, interval: float) -> List[ContainerView]:
    first, t0 = read_all(state_dir), time.monotonic_ns()
    if interval <= 0:
        return first
    time.sleep(interval)
    second, t1 = read_all(state_dir), time.monotonic_ns()
    add_rates(first, second, t1 - t0)
    return second


# ---- rendering (pure) ------------------------------------------------------

def _mib(value: int) -> str:
    return f"{value / MiB:.0f}"


def _limit_mib(value: int) -> str:
    return _mib(value) if value else "-"


def _sm(use: Optional[float], limit: int) -> str:
    used = "?" if use is None else f"{use:.0f}%"
    cap = f"{limit}%" if 0 < limit < 100 else "-"
    return f"{used} / {cap}"


def render_table(containers: List[ContainerView]) -> str:
    if not containers:
        return "no GPU containers"
    rows = [("CONTAINER", "DEV", "UUID", "MEMORY MiB (used / limit)", "SM (use / limit)", "PROCS")]
    for c in containers:
        if c.error:
            rows.append((c.id[:12], "-", "-", c.error, "", ""))
            continue
        for d in c.devices:
            procs = sum(1 for p in c.processes if p.uses(d.index))
            rows.append((c.id[:12], str(d.index), d.uuid, f"{_mib(d.mem_used_bytes)} / "
                         f"{_limit_mib(d.mem_limit_bytes)}", _sm(d.sm_use_pct, d.sm_limit_pct),
                         str(procs)))
        for p in c.processes:
            host = str(p.host_pid) if p.host_pid else "?"
            state = ", exited" if p.alive is False else ""
            for i, used in enumerate(p.mem_used_bytes):
                if not used and not p.launches[i]:
                    continue
                use = p.sm_use_pct[i] if i < len(p.sm_use_pct) else None
                rows.append((f"  pid {p.pid} (host {host}{state})", str(i), "",
                             f"{_mib(used)} (context {_mib(p.ctx_used_bytes[i])})",
                             "?" if use is None else f"{use:.0f}%", f"{p.launches[i]} launches"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
                     for row in rows)


def render_json(containers: List[ContainerView], interval: float) -> str:
    return json.dumps({"interval_s": interval, "containers": [asdict(c) for c in containers]},
                      indent=2)


# ---- CLI edge ----------------------------------------------------------------

def state_dir_option(func):
    return click.option("--state-dir", type=click.Path(file_okay=False),
                        help="the runtime's state dir (default: from the config)")(func)


def resolve_state_dir(state_dir: Optional[str]) -> str:
    """--state-dir, else the config's (hamictl --config, $HAMI_CONFIG, the default file)."""
    if state_dir:
        return state_dir
    from .. import config
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root().obj if ctx else None
    path = root.get("config_path") if isinstance(root, dict) else None
    return config.load(path).state_dir


@click.command("top")
@state_dir_option
@click.option("--interval", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="seconds between the two reads SM use is measured over (0: no SM use)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--watch", is_flag=True, help="refresh every interval until interrupted")
@click.option("--count", type=click.IntRange(min=1), default=None,
              help="with --watch: stop after this many refreshes")
def top_command(state_dir, interval, as_json, watch, count):
    """Memory and SM use per GPU container and process."""
    if watch and interval <= 0:
        raise click.BadParameter(f"{interval} must be above 0 with --watch", param_hint="--interval")
    state_dir = resolve_state_dir(state_dir)
    clear = watch and not as_json and sys.stdout.isatty()
    shown = 0
    try:
        while True:
            containers = sample(state_dir, interval)
            if clear:
                click.echo("\033[H\033[J", nl=False)
            click.echo(render_json(containers, interval) if as_json else render_table(containers))
            shown += 1
            if not watch or (count is not None and shown >= count):
                return
    except KeyboardInterrupt:
        return
