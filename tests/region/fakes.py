"""Writes region counters as libvgpu would, for tests that read them back; makes a
container's files as the runtime does; scrapes the metrics without a server."""
import mmap
from contextlib import contextmanager

from hami_runtime.lifecycle.node_state import container_files, state_layout
from hami_runtime.node import region


def make_container(state_dir, name, devices, core_policy="default", priority=1,
                   priority_idle_ms=region.PRIORITY_IDLE_MS_DEFAULT):
    """A GPU container's dirs, limits and region, as a create makes them; the region's path."""
    state_layout.make_dirs(str(state_dir), name)
    container_files.make(str(state_dir), name, devices, core_policy, priority, priority_idle_ms)
    return state_dir / "containers" / name / region.REGION_FILE_NAME


@contextmanager
def mapped(path):
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), region.REGION_SIZE) as m:
        c = region.ffi.from_buffer("struct hami_region *", m)
        try:
            yield c
        finally:
            region.ffi.release(c)


def fake_process(path, slot, pid, usage, host_pid=0, owner=None):
    """usage: {device: (mem_used, ctx_used, sm_busy_ns, launches)}."""
    with mapped(path) as c:
        s = c.procs[slot]
        s.owner = owner if owner is not None else (pid << 32) | 12345
        s.pid = pid
        s.host_pid = host_pid
        s.started_ns = 1
        for dev, (mem, ctx, busy, launches) in usage.items():
            s.mem_used[dev] = mem
            s.ctx_used[dev] = ctx
            s.sm_busy_ns[dev] = busy
            s.launches[dev] = launches


def add_busy(path, device, ns, slot=None):
    """Adds measured kernel time to the container (and to a process slot)."""
    with mapped(path) as c:
        c.sm[device].busy_ns += ns
        if slot is not None:
            c.procs[slot].sm_busy_ns[device] += ns


def patch_field(path, name, value, ctype="struct hami_region *"):
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        c = region.ffi.from_buffer(ctype, m)
        try:
            setattr(c, name, value)
        finally:
            region.ffi.release(c)


def add_sm(path, device, busy_ns=0, throttled_ns=0, paused_ns=0):
    """Advances the container's SM counters of `device` as libvgpu's launches would."""
    with mapped(path) as c:
        c.sm[device].busy_ns += busy_ns
        c.sm[device].throttled_ns += throttled_ns
        c.sm[device].paused_ns += paused_ns


def collect(state_dir):
    """One scrape's text, without a server."""
    from prometheus_client import CollectorRegistry, generate_latest

    from hami_runtime.tools import metrics
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics.RegionCollector(str(state_dir)))
    return generate_latest(registry).decode()
