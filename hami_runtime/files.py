"""Small file helpers: atomic replace, reading a process's start time."""
from __future__ import annotations

import os


def atomic_write(path: str, data: bytes, mode: int = 0o644) -> None:
    """Write to a temp file beside `path`, fsync, rename over it, fsync the dir:
    a reader (or a crash) sees the old file or the new one, never a mix."""
    import tempfile  # here: a create with no request writes nothing
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".hami-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def process_start(pid: int):
    """The process's start time in clock ticks since boot, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rfind(b")") + 2:].split()
    return int(fields[19])


def process_alive(pid: int, start) -> bool:
    return bool(pid) and start is not None and process_start(pid) == start
