"""Whether anyone but root (or the runtime's own user) could replace a
directory the node trusts, or anything on the way to it: the rule ssh applies
to a home directory before it reads authorized_keys.

Every directory on the way, from `/` down, must be owned by a trusted user and
not writable by group or others; a world-writable directory with the sticky
bit (/tmp) is passed only through an entry a trusted user owns, which no one
else may rename or remove there. A symbolic link on the way is followed, and
its target checked the same way. The directory itself must be a trusted user's
and not writable by group or others. A part of the path that does not exist yet is not a problem: whoever makes it
is the runtime, in a parent that passed.
"""
from __future__ import annotations

import os
import stat

_MAX_LINKS = 40  # as the kernel's ELOOP
# The node's state dir: its regions and stamps are writable by any user of their
# container, so no host user may reach them; containers get theirs by bind mounts.
STATE_DIR_MODE = 0o700


def _trusted(st) -> bool:
    return st.st_uid in (0, os.geteuid())


def _writable_by_others(st) -> bool:
    return bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def replace_problem(path: str) -> str:
    """'' when no untrusted user could replace `path` or a directory above it;
    else one sentence naming the directory at fault and why."""
    parts = [p for p in os.path.normpath(path).split("/") if p]
    current, links = "/", 0
    st = os.lstat(current)
    while True:
        if not stat.S_ISDIR(st.st_mode):
            return f"{current} is not a directory"
        if not _trusted(st):
            return f"{current} is owned by uid {st.st_uid}, not root"
        if not parts:
            return f"{current} is writable by group or others" if _writable_by_others(st) else ""
        name = parts.pop(0)
        child = os.path.join(current, name)
        try:
            child_st = os.lstat(child)
        except FileNotFoundError:
            child_st = None  # made by the runtime, in a sticky dir checked again once made
        if _writable_by_others(st) and not (st.st_mode & stat.S_ISVTX
                                            and (child_st is None or _trusted(child_st))):
            return f"{current} is writable by group or others, who could replace {child}"
        if child_st is None:
            return ""
        if stat.S_ISLNK(child_st.st_mode):  # in a dir no one else may change: it stays as it is
            links += 1
            if links > _MAX_LINKS:
                return f"{path} has too many symbolic links"
            target = os.path.normpath(os.path.join(current, os.readlink(child)))
            parts = [p for p in target.split("/") if p] + parts
            current = "/"
            st = os.lstat(current)
            continue
        current, st = child, child_st


def make_trusted_dir(path: str, mode: int) -> str:
    """`path` made (with `mode`) if missing and kept at `mode`, where no
    untrusted user could replace it; else, leaving everything as it was, the
    problem (replace_problem's sentence). OSError where it cannot be made."""
    problem = replace_problem(path)
    if not problem and not os.path.isdir(path):
        os.makedirs(path, mode=mode, exist_ok=True)
        problem = replace_problem(path)  # made by us, or by someone who raced us to it
    if not problem and stat.S_IMODE(os.lstat(path).st_mode) != mode:
        os.chmod(path, mode)
    return problem


def make_state_dir(state_dir: str) -> str:
    """make_trusted_dir for the node's state dir (what every writer into it calls first)."""
    return make_trusted_dir(state_dir, STATE_DIR_MODE)
