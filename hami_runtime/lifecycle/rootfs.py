"""What a GPU container's rootfs has at the paths the runtime makes mount points
of, read without following a link the image could plant (nothing is written).

runc resolves a mount's destination inside the root, following the image's
links: a /etc, /etc/ld.so.preload or /.hami that is a link would put the mount
at its target and leave the link, which the tenant can rename or remove, on the
path the loader and libvgpu use. So each must be what the runtime can hold:
/etc a directory (or absent: a tmpfs stands in), ld.so.preload a regular file
or absent, /.hami a directory or absent; anything else is refused.
"""
from __future__ import annotations

import json
import os
import stat

from ..errors import HamiError
from . import modifiers

KIND = {stat.S_IFLNK: "a symbolic link", stat.S_IFREG: "a regular file", stat.S_IFDIR: "a directory",
        stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFIFO: "a FIFO",
        stat.S_IFSOCK: "a socket"}
ALLOWED = {"etc": stat.S_IFDIR, "etc/ld.so.preload": stat.S_IFREG, ".hami": stat.S_IFDIR}


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
            etc_fd = os.open("etc", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd)
            try:
                found["etc/ld.so.preload"] = _kind(etc_fd, "ld.so.preload")
            finally:
                os.close(etc_fd)
    finally:
        os.close(root_fd)
    return found


def etc_hold(bundle: str, spec: dict) -> modifiers.EtcHold:
    """/etc's own mount point for this spec's root (modifiers.etc_hold), once the
    image's /etc, /etc/ld.so.preload and /.hami are found to be what it can hold."""
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
    return modifiers.etc_hold(os.path.join(root, "etc") if found["etc"] else None, readonly)
