"""A container's cgroup as the host sees it: which processes are in it, and its
freezer. Found from a process of the container (its first one, whose host pid
the createRuntime hook records) through /proc/<pid>/cgroup, or from the spec's
linux.cgroupsPath; never from anything the container writes.

- cgroup v2 (unified) lists the processes where it is mounted (/sys/fs/cgroup,
  or /sys/fs/cgroup/unified beside v1 controllers on a hybrid host, where runc
  puts each container in it too); v1 alone, the freezer's or the pids' hierarchy.
  A container's processes are those of its cgroup and of every cgroup below it.
- Freezing follows runc: where the v1 freezer is mounted (v1 or hybrid hosts,
  as runc's `pause` does) freezer.state; on a v2-only host cgroup.freeze.
- A cgroup that holds the caller too (the root, or one above the caller's own)
  is never taken as a container's: a pid the container's first process no
  longer has would otherwise name every process of the host.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set

V1_PREFERENCE = ("freezer", "pids", "memory", "cpu", "devices", "name=systemd")


def _unescape(path: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    out, i = [], 0
    while i < len(path):
        if path[i] == "\\" and path[i + 1:i + 4].isdigit():
            out.append(chr(int(path[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(path[i])
            i += 1
    return "".join(out)


def mounts(mountinfo: str = "/proc/self/mountinfo") -> Dict[str, str]:
    """hierarchy -> where it is mounted: "" for v2, each v1 controller (and
    name=...) for its hierarchy. A hierarchy mounted twice: its first mount of
    its root."""
    found: Dict[str, str] = {}
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return found
    for line in lines:
        head, sep, tail = line.partition(" - ")
        parts, rest = head.split(), tail.split()
        if not sep or len(parts) < 5 or len(rest) < 3 or parts[3] != "/":
            continue
        point = _unescape(parts[4])
        if rest[0] == "cgroup2":
            found.setdefault("", point)
        elif rest[0] == "cgroup":
            for option in rest[2].split(","):
                if option in ("rw", "ro") or "=" in option and not option.startswith("name="):
                    continue
                found.setdefault(option, point)
    return found


def of_process(pid: int, proc: str = "/proc") -> Dict[str, str]:
    """hierarchy -> the process's cgroup path in it ({} when it is gone)."""
    try:
        with open(f"{proc}/{pid}/cgroup", encoding="utf-8", errors="surrogateescape") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return {}
    found = {}
    for line in lines:
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if not path.startswith("/"):
            continue
        if hid == "0" and controllers == "":
            found[""] = path
        else:
            for name in controllers.split(","):
                found[name] = path
    return found


def _within(path: str, top: str) -> bool:
    return top == "/" or path == top or path.startswith(top.rstrip("/") + "/")


@dataclass
class Cgroup:
    """A container's cgroup: the dir whose cgroup.procs lists its processes, and
    its freezer (kind "v1": freezer.state, "v2": cgroup.freeze; "" none). The
    cgroup.procs files are kept open and read again from their start (one
    pread each): close() lets them go."""
    procs_dir: str
    freezer_kind: str = ""
    freezer_dir: str = ""
    below: List[str] = field(default_factory=list)  # cgroups under it, as last listed
    fds: Dict[str, int] = field(default_factory=dict, repr=False, compare=False)

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()

    def list_below(self) -> None:
        """Lists the cgroups under it again (their files opened as they are read)."""
        self.below = subtree(self.procs_dir)
        keep = {self.procs_dir, *self.below}
        for path in [p for p in self.fds if p not in keep]:
            os.close(self.fds.pop(path))


def locate(paths: Dict[str, str], where: Dict[str, str], own: Dict[str, str]) -> Optional[Cgroup]:
    """The container's Cgroup from its process's cgroup `paths`, the host's
    mounts `where` and the caller's own cgroup `own`; None where none is usable."""
    def usable(hierarchy):
        path = paths.get(hierarchy)
        mine = own.get(hierarchy, "/")
        if hierarchy not in where or not path or path == "/" or _within(mine, path):
            return None
        return os.path.join(where[hierarchy], path.lstrip("/"))

    listing = usable("")
    for hierarchy in V1_PREFERENCE:
        if listing:
            break
        listing = usable(hierarchy)
    if not listing or not os.path.isdir(listing):
        return None
    v1 = usable("freezer")
    if v1 and os.path.exists(os.path.join(v1, "freezer.state")):
        return Cgroup(listing, "v1", v1)
    v2 = usable("") if "freezer" not in where else None
    if v2 and os.path.exists(os.path.join(v2, "cgroup.freeze")):
        return Cgroup(listing, "v2", v2)
    return Cgroup(listing)


def from_spec_path(cgroups_path: str, where: Dict[str, str], own: Dict[str, str]) -> Optional[Cgroup]:
    """The Cgroup a spec's linux.cgroupsPath names where it is a path (cgroupfs
    drivers); a systemd driver's slice:prefix:name is not one, and gives None."""
    if not isinstance(cgroups_path, str) or not cgroups_path.startswith("/") or ":" in cgroups_path:
        return None
    return locate({h: cgroups_path for h in where}, where, own)


def _read_pids(cgroup: Cgroup, path: str) -> Optional[Set[int]]:
    """The pids in cgroup `path`'s cgroup.procs; None where it is gone."""
    fd = cgroup.fds.get(path)
    try:
        if fd is None:
            fd = cgroup.fds[path] = os.open(os.path.join(path, "cgroup.procs"), os.O_RDONLY | os.O_CLOEXEC)
        data = os.pread(fd, 65536, 0)  # from the start: the kernel lists them again
        while len(data) % 65536 == 0 and data:
            more = os.pread(fd, 65536, len(data))
            if not more:
                break
            data += more
    except OSError:  # removed (ENODEV on a kept fd, ENOENT on a new one)
        if fd is not None:
            os.close(cgroup.fds.pop(path))
        return None
    return set(map(int, data.split()))


def subtree(top: str) -> List[str]:
    """The cgroups below `top` (dirs of its dir, all depths)."""
    found = []
    stack = [top]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                dirs = [e.path for e in entries if e.is_dir(follow_symlinks=False)]
        except OSError:
            continue
        found.extend(dirs)
        stack.extend(dirs)
    return found


def pids_of(cgroup: Cgroup) -> Optional[Set[int]]:
    """The pids in the cgroup itself, read through its file kept open; None
    where that needs more (not open yet, gone, or longer than one read)."""
    fd = cgroup.fds.get(cgroup.procs_dir)
    if fd is None:
        return None
    try:
        data = os.pread(fd, 65536, 0)
    except OSError:
        return None
    return set(map(int, data.split())) if len(data) < 65536 else None


def processes(cgroup: Cgroup) -> Optional[Set[int]]:
    """Host pids of every process in the cgroup and those below it (as last
    listed: Cgroup.list_below, which the caller calls now and then); None where
    the cgroup itself is gone."""
    pids = _read_pids(cgroup, cgroup.procs_dir)
    if pids is None:
        return None
    for path in cgroup.below:
        pids |= _read_pids(cgroup, path) or set()
    return pids


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def frozen(cgroup: Cgroup) -> bool:
    """Frozen now (by anyone: the agent, or runc pause)."""
    try:
        if cgroup.freezer_kind == "v1":
            with open(os.path.join(cgroup.freezer_dir, "freezer.state"), encoding="ascii") as handle:
                return handle.read().strip() != "THAWED"
        if cgroup.freezer_kind == "v2":
            with open(os.path.join(cgroup.freezer_dir, "cgroup.freeze"), encoding="ascii") as handle:
                return handle.read().strip() == "1"
    except OSError:
        pass
    return False


def freeze(cgroup: Cgroup, on: bool) -> None:
    """Freezes (on) or thaws the cgroup; OSError where it cannot."""
    if cgroup.freezer_kind == "v1":
        _write(os.path.join(cgroup.freezer_dir, "freezer.state"), "FROZEN" if on else "THAWED")
    elif cgroup.freezer_kind == "v2":
        _write(os.path.join(cgroup.freezer_dir, "cgroup.freeze"), "1" if on else "0")
    else:
        raise OSError(95, "no freezer for this cgroup")
