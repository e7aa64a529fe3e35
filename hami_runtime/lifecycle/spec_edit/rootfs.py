"""What a GPU container's rootfs has at the paths the runtime makes mount points
of, read without following a link the image could plant (nothing is written);
and, after runc's mounts, whether the container's mount tree holds them as the
runtime meant (the createRuntime hook's check, hami_hook; the launcher's C hook,
launcher/hook.c, makes the same check with the same lines).

runc resolves a mount's destination inside the root, following the image's
links: a /etc, /etc/ld.so.preload or /.hami that is a link would put the mount
at its target and leave the link, which the tenant can rename or remove, on the
path the loader and libvgpu use. So each must be what the runtime can hold:
/etc a directory (or absent: a tmpfs stands in), ld.so.preload a regular file
or absent, /.hami a directory or absent; anything else is refused.

That look is made at create, and runc mounts a moment later: a second container
given the same rootfs dir can swap /etc or /.hami with a link in between (and
runc follows a link in the source of the /etc bind on the host). So the
createRuntime hook looks again once runc has made every mount and before the
container's process starts: runc runs it on the host while its init waits in
the container's mount namespace, not yet pivoted, so /proc/<pid>/root shows the
container's mount tree at the rootfs's host path (mounted_problem).
"""
from __future__ import annotations

import errno
import json
import os
import posixpath
import stat
from typing import TYPE_CHECKING, NamedTuple

from ...errors import HamiError

if TYPE_CHECKING:
    from . import modifiers

KIND = {stat.S_IFLNK: "a symbolic link", stat.S_IFREG: "a regular file", stat.S_IFDIR: "a directory",
        stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFIFO: "a FIFO",
        stat.S_IFSOCK: "a socket"}
ALLOWED = {"etc": stat.S_IFDIR, "etc/ld.so.preload": stat.S_IFREG, ".hami": stat.S_IFDIR}

# What the createRuntime hook finds at the container's /etc (its --etc):
ETC_BIND = "bind"    # the rootfs's own /etc, bound onto itself (a writable root)
ETC_DIR = "dir"      # the rootfs's own /etc (a read-only root: runc binds it onto itself after the hook)
ETC_MOUNT = "mount"  # a mount point: the tmpfs that stands for a missing /etc, or the spec's own /etc mount
ETC_MODES = (ETC_BIND, ETC_DIR, ETC_MOUNT)


class Image(NamedTuple):
    root: str                   # the root's real path on the host
    hold: "modifiers.EtcHold"   # /etc's own mount point (modifiers.etc_hold)
    etc: str                    # what the hook finds at /etc: one of ETC_MODES


def root_path(bundle: str, spec: dict) -> str:
    root = spec.get("root")
    path = root.get("path") if isinstance(root, dict) else None
    if not isinstance(path, str) or not path:
        raise HamiError("root.path", json.dumps(root)[:80], "a GPU container needs its root's path")
    return os.path.realpath(os.path.join(bundle, path))


def _kind(dir_fd: int, name: str):
    """The file type at `name` under dir_fd, not following a link; None if absent."""
    try:
        return stat.S_IFMT(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return None


def _found(root: str) -> dict:
    """The file types of ALLOWED's names under `root` (None: absent), no link followed."""
    root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        found = {name: _kind(root_fd, name) for name in ("etc", ".hami")}
        if found["etc"] == stat.S_IFDIR:
            try:
                etc_fd = os.open("etc", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                 dir_fd=root_fd)
            except OSError as exc:  # replaced since the look above
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                    raise
                return {**found, "etc": _kind(root_fd, "etc") or stat.S_IFLNK}
            try:
                found["etc/ld.so.preload"] = _kind(etc_fd, "ld.so.preload")
            finally:
                os.close(etc_fd)
    finally:
        os.close(root_fd)
    return found


def _mounts_etc(spec: dict, ours) -> bool:
    """The spec mounts /etc itself (modifiers.hold_etc then adds no mount of its own)."""
    mine = None if ours is None else {"destination": ours.destination, "type": ours.type,
                                      "source": ours.source, "options": list(ours.options)}
    return any(isinstance(m, dict) and m != mine
               and posixpath.normpath("/" + str(m.get("destination", "")).lstrip("/")) == "/etc"
               for m in spec.get("mounts") or [])


def image(bundle: str, spec: dict) -> Image:
    """The root, /etc's own mount point for it, and what the hook is to find at /etc,
    once the image's /etc, /etc/ld.so.preload and /.hami are found to be what the
    runtime can hold."""
    from . import modifiers
    root = root_path(bundle, spec)
    try:
        found = _found(root)
    except OSError as exc:
        raise HamiError("root.path", root, f"cannot read the root: {exc.strerror}") from None
    for name, kind in found.items():
        if kind is not None and kind != ALLOWED[name]:
            raise HamiError(f"root /{name}", os.path.join(root, name),
                            f"is {KIND.get(kind, 'not a plain file')} in the image: a GPU container's "
                            f"/{name} must be {KIND[ALLOWED[name]]} or absent, as the runtime makes a "
                            "mount point of it that the container cannot rename")
    readonly = bool((spec.get("root") or {}).get("readonly"))
    hold = modifiers.etc_hold(os.path.join(root, "etc") if found["etc"] else None, readonly)
    if not found["etc"] or _mounts_etc(spec, hold.mount):
        etc = ETC_MOUNT
    else:
        etc = ETC_DIR if readonly else ETC_BIND
    return Image(root, hold, etc)


# The check after runc's mounts. Each path is opened without following a link
# (O_PATH | O_NOFOLLOW, one component at a time) and compared by device and inode
# with what the runtime made on the host; "is a mount point" is a mount id other
# than the root's (a bind of a dir onto itself keeps its device).

class _Mismatch(Exception):
    pass


def _describe(st) -> str:
    if st is None:
        return "nothing"
    kind = KIND.get(stat.S_IFMT(st.st_mode), "an odd file")
    return f"{kind} (device {os.major(st.st_dev)}:{os.minor(st.st_dev)}, inode {st.st_ino})"


def _same(a, b) -> bool:
    return a is not None and b is not None and (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _walk(start_fd: int, path: str) -> int:
    """An O_PATH fd on the directory `path` (absolute) under start_fd, no link followed."""
    fd = os.dup(start_fd)
    try:
        for part in filter(None, path.split("/")):
            if part in (".", ".."):
                raise OSError(errno.EINVAL, "not a normal path")
            next_fd = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _at(dir_fd: int, name: str):
    """(fd or None, stat or None) of `name` under dir_fd, the link itself if it is one."""
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None, None
    return fd, os.fstat(fd)


def _mount_id(fd: int) -> int:
    with open(f"/proc/self/fdinfo/{fd}", "rb") as f:
        for line in f:
            if line.startswith(b"mnt_id:"):
                return int(line.split()[1])
    raise OSError(errno.ENOSYS, "no mnt_id in /proc/self/fdinfo")


def mounted_problem(pid: int, root: str, etc: str, state_dir: str, name: str, libvgpu: str) -> str:
    """'' when the mount tree of runc's init `pid` (after runc's mounts, before
    pivot_root) holds, at `root`: /etc as `etc` (ETC_MODES) says, not a link;
    /etc/ld.so.preload the very file the runtime made for the allocation `name`
    (private/<name>/ld.so.preload); /.hami a mount point on a device of its own
    holding libvgpu.so, the file `libvgpu`, limits, private/<name>/limits, and
    shared/, activity/ and priority/, containers/<name>/ and the boards. Else the
    one line that says which path holds what instead."""
    private = os.path.join(state_dir, "private", name)
    # (in /.hami, or None for the preload; what it is; the host's path; followed; a dir)
    host_files = [(None, "the preload the runtime made for it", os.path.join(private, "ld.so.preload"), False, False),
                  ("libvgpu.so", "the node's libvgpu", libvgpu, True, False),
                  ("limits", "its limits", os.path.join(private, "limits"), False, False),
                  ("shared", "its region dir", os.path.join(state_dir, "containers", name), False, True),
                  ("activity", "the activity board", os.path.join(state_dir, "activity"), False, True),
                  ("priority", "the priority board", os.path.join(state_dir, "priority"), False, True)]
    fds: list[int] = []

    def keep(fd):
        if fd is not None:
            fds.append(fd)
        return fd

    def expect(path, st, expected, ok):
        if not ok:
            raise _Mismatch(f"{path} is {_describe(st)}, not {expected}")

    try:
        host = []
        for _, _, path, follow, is_dir in host_files:
            try:
                st = os.stat(path, follow_symlinks=follow)
            except OSError as exc:
                return f"{path}: {exc.strerror}: nothing to check the container's mounts against"
            if (stat.S_ISDIR if is_dir else stat.S_ISREG)(st.st_mode):
                host.append(st)
            else:
                return f"{path} is {_describe(st)}, not {'a directory' if is_dir else 'a regular file'}"
        try:
            host_root = keep(_walk(keep(os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)), root))
        except OSError as exc:
            return f"{root}: {exc.strerror}: the rootfs cannot be opened on the host without following a link"
        proc_root = f"/proc/{pid}/root"
        try:
            proc = keep(os.open(proc_root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
            try:
                inside = keep(_walk(proc, root))
            except FileNotFoundError:
                # a runtime that pivots before createRuntime: the init's root is the rootfs
                if not _same(os.fstat(proc), os.fstat(host_root)):
                    raise
                inside = keep(os.dup(proc))
        except OSError as exc:
            return (f"{root}: {exc.strerror}: cannot be opened in the container's mount namespace "
                    f"({proc_root}) without following a link")
        root_st = os.fstat(inside)
        expect(root, root_st, f"the rootfs the host has there ({_describe(os.fstat(host_root))})",
               _same(root_st, os.fstat(host_root)))
        root_mount = _mount_id(inside)

        path = os.path.join(root, "etc")
        etc_fd, etc_st = _at(inside, "etc")
        keep(etc_fd)
        expect(path, etc_st, "a directory", etc_st is not None and stat.S_ISDIR(etc_st.st_mode))
        if etc in (ETC_BIND, ETC_DIR):
            own_fd, own_st = _at(host_root, "etc")
            keep(own_fd)
            expect(path, etc_st, f"the rootfs's own /etc ({_describe(own_st)})", _same(etc_st, own_st))
        if etc in (ETC_BIND, ETC_MOUNT) and _mount_id(etc_fd) == root_mount:
            raise _Mismatch(f"{path} is the rootfs's directory, not a mount point of its own: "
                            "runc's /etc mount went elsewhere")
        path = os.path.join(root, "etc", "ld.so.preload")
        fd, st = _at(etc_fd, "ld.so.preload")
        keep(fd)
        expect(path, st, f"{host_files[0][1]} ({host_files[0][2]})", _same(st, host[0]))

        path = os.path.join(root, ".hami")
        hami_fd, hami_st = _at(inside, ".hami")
        keep(hami_fd)
        expect(path, hami_st, "a directory", hami_st is not None and stat.S_ISDIR(hami_st.st_mode))
        if _mount_id(hami_fd) == root_mount or hami_st.st_dev == root_st.st_dev:
            raise _Mismatch(f"{path} is the rootfs's directory, not the runtime's tmpfs: "
                            "runc's /.hami mount went elsewhere")
        for (in_hami, what, host_path, _, _), host_st in zip(host_files[1:], host[1:]):
            fd, st = _at(hami_fd, in_hami)
            keep(fd)
            expect(os.path.join(path, in_hami), st, f"{what} ({host_path})", _same(st, host_st))
        return ""
    except _Mismatch as exc:
        return str(exc)
    except OSError as exc:
        return f"{root}: cannot check the container's mounts: {exc.strerror or exc}"
    finally:
        for fd in fds:
            os.close(fd)
