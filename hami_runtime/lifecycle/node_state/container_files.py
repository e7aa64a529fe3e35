"""A GPU container's limits and region on the host, and how host tools open them.

  private/<name>/limits          the limits (host-only dir; bind-mounted read-only
                                 into the container, so nothing inside changes them)
  private/<name>/region.json     the region's identity: device and inode
  containers/<name>/vgpu.region  the region: the processes' usage (the dir is
                                 mounted read-write: the container can replace,
                                 remove or link anything in it)

Host tools (hamictl top, metrics, update) open both files through directory fds,
never following a link or blocking on a FIFO, and take the region only if it is
that very file (its identity, recorded when the runtime made it): anything else is
that container's error, shown as such, never a path to another file.
"""
from __future__ import annotations

import contextlib
import json
import os

from ...errors import HamiError
from . import state_layout, store

IDENTITY_FILE = "region.json"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def limits_path(state_dir: str, name: str) -> str:
    from ...node import region
    return os.path.join(state_layout.private_dir(state_dir, name), region.LIMITS_FILE_NAME)


def make(state_dir: str, name: str, devices, core_policy: str, priority: int,
         priority_idle_ms: int) -> None:
    """The container's limits, a fresh region and its identity (its dirs exist)."""
    from ...files import atomic_write
    from ...node import region
    region.create_limits(limits_path(state_dir, name), devices, core_policy, priority, priority_idle_ms)
    made = region.create_region(os.path.join(state_layout.container_dir(state_dir, name),
                                             region.REGION_FILE_NAME))
    atomic_write(os.path.join(state_layout.private_dir(state_dir, name), IDENTITY_FILE),
                 json.dumps(region.identity(made)).encode(), 0o644)


@contextlib.contextmanager
def _dir(state_dir: str, sub: str, name: str):
    """An fd on <sub>/<name>, opened without following a link anywhere on the way."""
    parent = state_layout.subdir_fd(state_dir, sub)
    if parent is None:
        raise FileNotFoundError(f"{state_dir}/{sub}: missing")
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        why = "a symbolic link" if exc.errno == 40 else exc.strerror  # ELOOP
        raise HamiError(f"{state_dir}/{sub}/{name}", "", f"not the runtime's directory: {why}") from None
    finally:
        os.close(parent)
    try:
        yield fd
    finally:
        os.close(fd)


def region_identity(state_dir: str, name: str):
    """The identity recorded for the region, None when none is (or not one)."""
    found = store.read_json(os.path.join(state_layout.private_dir(state_dir, name), IDENTITY_FILE))
    if isinstance(found, list) and len(found) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in found):
        return found
    return None


def open_limits(state_dir: str, name: str, writable: bool = False):
    from ...node import region
    with _dir(state_dir, "private", name) as fd:
        return region.open_limits(region.LIMITS_FILE_NAME, writable=writable, dir_fd=fd,
                                  label=os.path.join(state_dir, "private", name, region.LIMITS_FILE_NAME))


def open_region(state_dir: str, name: str):
    """The region the runtime made for `name`, read-only; RegionError (or OSError,
    HamiError) when it is not there or not that file."""
    from ...node import region
    expect = region_identity(state_dir, name)
    if expect is None:
        raise region.RegionError(f"{name}: no record of the region the runtime made")
    with _dir(state_dir, "containers", name) as fd:
        return region.open(region.REGION_FILE_NAME, dir_fd=fd, expect=expect,
                           label=os.path.join(state_dir, "containers", name, region.REGION_FILE_NAME))


def processes(state_dir: str, name: str, reg, device_count: int):
    """[(process, alive)] of the region: each with the host pid the host finds for
    it in the container's pid namespace (node/host_pids.py; the region's own
    host_pid is only what the container says), and whether it still runs: True,
    False (gone, or its pid now another process's), None (the host cannot look:
    the container's first process is not known or gone)."""
    from ...node import host_pids
    found = host_pids.in_namespace_of(state_layout.host_pid(state_dir, name))
    seen = []
    for proc in reg.processes(device_count):
        proc = proc._replace(host_pid=found.get(proc.pid, 0))
        seen.append((proc, proc.alive() if proc.host_pid else (False if found else None)))
    return seen


@contextlib.contextmanager
def opened(state_dir: str, name: str, writable_limits: bool = False):
    """(limits, region) of `name`, both closed on the way out."""
    limits = open_limits(state_dir, name, writable_limits)
    try:
        reg = open_region(state_dir, name)
    except BaseException:
        limits.close()
        raise
    try:
        yield limits, reg
    finally:
        reg.close()
        limits.close()
