"""Small file helpers: atomic replace, reading state files that anyone with
write access to the state dir may have tampered with, a process's start time."""
from __future__ import annotations

import hashlib
import os
import stat

from .errors import HamiError

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISDIR, "a directory"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_state_file(path: str, flags: int = os.O_RDONLY, mode: int = 0o600) -> int:
    """An fd for a state file: a regular file owned by root or us, never
    through a symlink, never blocking on a FIFO. Anything else is a refusal
    that names the path."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY, mode)
    except OSError as exc:
        if exc.errno == 40:  # ELOOP: the last part is a symlink
            raise HamiError(path, "", "is a symbolic link: state files must be regular files") \
                from None
        raise
    st = os.fstat(fd)
    why = ""
    if not stat.S_ISREG(st.st_mode):
        why = f"is {_kind(st.st_mode)}: state files must be regular files"
    elif st.st_uid not in (0, os.geteuid()):
        why = f"is owned by uid {st.st_uid}: state files must be root's (or ours)"
    if why:
        os.close(fd)
        raise HamiError(path, "", why)
    return fd


def file_key(path: str, st) -> list:
    """What changes when the file at `path` (stat `st`) is replaced or rewritten."""
    return [path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def read_state_file(path: str, limit: int) -> bytes:
    """The bytes of a state file (see open_state_file), at most `limit` of them."""
    fd = open_state_file(path)
    try:
        size = os.fstat(fd).st_size
        data = os.read(fd, limit + 1) if size <= limit else b""
        if size > limit or len(data) > limit:
            raise HamiError(path, "", f"is larger than {limit} bytes: not a state file")
        return data
    finally:
        os.close(fd)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def temp_beside(path: str, prefix: str = ".hami-"):
    """(fd, name) of a new file beside `path` that no one else has opened."""
    directory = os.path.dirname(os.path.abspath(path))
    for _ in range(100):
        tmp = os.path.join(directory, f"{prefix}{os.getpid()}-{os.urandom(6).hex()}")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                           | os.O_CLOEXEC, 0o600), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"{directory}: no free temporary name")


def atomic_write(path: str, data: bytes, mode: int = 0o644) -> None:
    """Write to a temp file beside `path`, fsync, rename over it, fsync the dir:
    a reader (or a crash) sees the old file or the new one, never a mix."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = temp_beside(path)
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


BOOT_ID = "/proc/sys/kernel/random/boot_id"


def boot_id(path: str = BOOT_ID) -> str:
    """This boot's id; "" where it cannot be read. Read as bytes: a text read looks
    the codec up, an import in each of the create server's children."""
    try:
        with open(path, "rb") as handle:
            return handle.read().decode("ascii", "replace").strip()
    except OSError:
        return ""


def _stat_fields(pid: int):
    """/proc/<pid>/stat's fields after the command name (state first), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat_line = handle.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: split after the last ')'.
    return stat_line[stat_line.rfind(b")") + 2:].split()


def process_start(pid: int):
    """The process's start time in clock ticks since boot, None if it is gone."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def process_alive(pid, start) -> bool:
    """The process that started at `start` still runs: not gone, not another one
    with its pid, and not a zombie (exited, its parent has yet to reap it)."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0 or start is None:
        return False
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] not in (b"Z", b"X") and int(fields[19]) == start
