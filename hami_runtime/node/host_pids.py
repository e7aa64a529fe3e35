"""Host pids of a container's processes, as the host sees them.

A container's processes count themselves in its region by the pids of their own
pid namespace. The host knows the namespace from the container's first process
(its host pid, which the createRuntime hook records) and finds each process of
that namespace in its own /proc: the last NSpid of /proc/<pid>/status is the pid
the container sees. Nothing the container writes enters this mapping except the
container pids looked up, which can only name processes of its own namespace.
"""
from __future__ import annotations

import os


def _pid_namespace(pid: int, proc_root: str) -> tuple[int, int] | None:
    try:
        st = os.stat(f"{proc_root}/{pid}/ns/pid")
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _inner_pid(pid: int, proc_root: str) -> int | None:
    """The pid process `pid` has in its own (innermost) pid namespace."""
    try:
        with open(f"{proc_root}/{pid}/status", "rb") as handle:
            for line in handle:
                if line.startswith(b"NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return None


def in_namespace_of(init_host_pid: int, proc_root: str = "/proc") -> dict[int, int]:
    """{pid in the container: pid on the host} for every process in the pid
    namespace of host process `init_host_pid` ({} when it is gone or unknown)."""
    if init_host_pid <= 0:
        return {}
    namespace = _pid_namespace(init_host_pid, proc_root)
    if namespace is None:
        return {}
    found = {}
    for entry in os.listdir(proc_root):
        if entry.isdigit() and _pid_namespace(int(entry), proc_root) == namespace:
            inner = _inner_pid(int(entry), proc_root)
            if inner is not None:
                found[inner] = int(entry)
    return found
