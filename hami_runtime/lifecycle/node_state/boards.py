"""The boards: which containers work on each GPU, and whose work is high priority.

Every GPU container has one activity stamp per granted GPU, a zeroed file of
STAMP_BYTES in its own region dir (mounted read-write, so its processes can
stamp it):

  <state_dir>/containers/<name>/activity/<gpu uuid>

Two boards hold, per GPU, hard links to stamps:

  <state_dir>/activity/<gpu uuid>/<name>   every GPU container there (the
                                           `default` SM policy asks whether
                                           another container works)
  <state_dir>/priority/<gpu uuid>/<name>   the high-priority (priority 0) ones
                                           (low-priority work waits for theirs)

Both are mounted read-only into every GPU container (libvgpu reads them; see
libvgpu_src/activity.h). Only the host links or unlinks, so a container can
write its own stamp but cannot reach another's, nor add itself to a board; a
change of priority is one link or unlink, seen by running processes within 100 ms.

Names and UUIDs are checked before they reach a path; directories are opened
without following symlinks, and a stamp that is not a regular file is never
linked.
"""
from __future__ import annotations

import contextlib
import os
import stat
import time

from ...errors import HamiError
from ...names import gpu_uuid
from . import state_layout

ACTIVITY = "activity"         # the activity board, under the state dir
PRIORITY = "priority"         # the priority board, likewise
STAMP_DIR = "activity"        # under containers/<name>/
STAMP_BYTES = 64              # libvgpu_src/priority.h: HAMI_STAMP_BYTES
PRIORITIES = (0, 1)           # 0 high, 1 low
STALE_TEMP_S = 60
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def board_root(state_dir: str, board: str) -> str:
    return os.path.join(state_dir, board)


def _uuids(gpu_uuids) -> list[str]:
    uuids = list(gpu_uuids)
    for uuid in uuids:
        if not isinstance(uuid, str) or not gpu_uuid(uuid):
            raise HamiError("GPU UUID", uuid, "is not a GPU UUID")
    return uuids


def _open_dir(parent_fd: int, name: str, create: bool = False) -> int | None:
    """An fd on the directory `name` under parent_fd, None when absent; a
    symlink (or anything else that is not a directory) there is refused."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=parent_fd)
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise HamiError(name, "", f"is not a directory of ours: {exc.strerror}") from None


@contextlib.contextmanager
def _board(state_dir: str, board: str, create: bool):
    fd = state_layout.subdir_fd(state_dir, board, create=create)
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


def _each_gpu_dir(board: int, visit) -> None:
    """visit(uuid, fd) for every GPU's dir on the board; each fd closed after."""
    for uuid in os.listdir(board):
        gpu_fd = _open_dir(board, uuid) if gpu_uuid(uuid) else None
        if gpu_fd is not None:
            try:
                visit(uuid, gpu_fd)
            finally:
                os.close(gpu_fd)


@contextlib.contextmanager
def _stamps(state_dir: str, name: str, create: bool):
    """An fd on containers/<name>/activity (None when there is none)."""
    containers = state_layout.subdir_fd(state_dir, "containers", create=create)
    if containers is None:
        yield None
        return
    own = activity = None
    try:
        own = _open_dir(containers, name)
        activity = _open_dir(own, STAMP_DIR, create=create) if own is not None else None
        yield activity
    finally:
        for fd in (activity, own, containers):
            if fd is not None:
                os.close(fd)


def make_stamps(state_dir: str, name: str, gpu_uuids) -> None:
    """The container's zeroed stamps, one per GPU (its region dir exists)."""
    state_layout.check_name(name)
    uuids = _uuids(gpu_uuids)
    with _stamps(state_dir, name, create=True) as activity:
        if activity is None:
            raise HamiError("container dir", name, "is missing")
        for uuid in uuids:
            with contextlib.suppress(FileExistsError):
                fd = os.open(uuid, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o666, dir_fd=activity)
                try:
                    os.fchmod(fd, 0o666)   # any user of the container stamps it
                    os.ftruncate(fd, STAMP_BYTES)
                finally:
                    os.close(fd)


def _same(st_a, st_b) -> bool:
    return (st_a.st_dev, st_a.st_ino) == (st_b.st_dev, st_b.st_ino)


def _link(activity: int, uuid: str, gpu_fd: int, name: str) -> None:
    """board/<uuid>/<name> -> the stamp, replaced atomically; nothing when the
    stamp is missing or not a regular file."""
    try:
        stamp = os.stat(uuid, dir_fd=activity, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(stamp.st_mode):
        return
    with contextlib.suppress(FileNotFoundError):
        if _same(os.stat(name, dir_fd=gpu_fd, follow_symlinks=False), stamp):
            return
    tmp = f".{os.getpid()}-{os.urandom(6).hex()}"   # libvgpu skips dot names
    os.link(uuid, tmp, src_dir_fd=activity, dst_dir_fd=gpu_fd, follow_symlinks=False)
    try:
        # what was linked, as the stamp may have been swapped in between
        linked = os.stat(tmp, dir_fd=gpu_fd, follow_symlinks=False)
        if stat.S_ISREG(linked.st_mode):
            os.rename(tmp, name, src_dir_fd=gpu_fd, dst_dir_fd=gpu_fd)
            tmp = None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=gpu_fd)


def _link_only(state_dir: str, board: str, name: str, uuids: list[str], wanted: set[str]) -> None:
    """Make `board` say it: the container's stamps on the GPUs in `wanted`, and
    on no other GPU. Idempotent."""
    def drop_unwanted(uuid, gpu_fd):
        if uuid not in wanted:
            state_layout.remove_at(gpu_fd, name)

    with _board(state_dir, board, create=True) as board_fd:
        _each_gpu_dir(board_fd, drop_unwanted)
        if not wanted:
            return
        with _stamps(state_dir, name, create=False) as activity:
            if activity is None:
                return
            for uuid in uuids:
                if uuid in wanted:
                    gpu_fd = _open_dir(board_fd, uuid, create=True)
                    try:
                        _link(activity, uuid, gpu_fd, name)
                    finally:
                        os.close(gpu_fd)


def join(state_dir: str, name: str, gpu_uuids) -> None:
    """The container's stamps on the activity board of each of its GPUs (create)."""
    state_layout.check_name(name)
    uuids = _uuids(gpu_uuids)
    _link_only(state_dir, ACTIVITY, name, uuids, set(uuids))


def set_priority(state_dir: str, name: str, gpu_uuids, priority: int) -> None:
    """Make the priority board say it: with priority 0, the container's stamps on its
    GPUs (and no others) are linked; with 1, none is. Idempotent; create and
    `hamictl update --priority` come through here (release through clear)."""
    state_layout.check_name(name)
    uuids = _uuids(gpu_uuids)
    if priority not in PRIORITIES or isinstance(priority, bool):
        raise HamiError("priority", priority, "must be 0 (high) or 1 (low)")
    _link_only(state_dir, PRIORITY, name, uuids, set(uuids) if priority == 0 else set())


def clear(state_dir: str, name: str) -> None:
    """The container's entries leave both boards (its allocation is freed)."""
    for board in (ACTIVITY, PRIORITY):
        with _board(state_dir, board, create=False) as board_fd:
            if board_fd is not None:
                _each_gpu_dir(board_fd, lambda _, gpu_fd: state_layout.remove_at(gpu_fd, name))


def _drop_stale_temp(gpu_fd: int, entry: str) -> None:
    """A temporary link left by a set_priority killed half-way (one still in
    flight, outside the allocator lock, is younger than a minute)."""
    with contextlib.suppress(OSError):
        if time.time() - os.stat(entry, dir_fd=gpu_fd, follow_symlinks=False).st_ctime > STALE_TEMP_S:
            os.unlink(entry, dir_fd=gpu_fd)


def sweep(state_dir: str, allocations: dict[str, dict]) -> None:
    """Entries that no allocation on that GPU owns go (a crash between steps, an
    entry turned invalid), and from the priority board those of a low-priority
    one. GPU dirs stay: containers have the boards mounted and see new entries
    in them."""
    for board in (ACTIVITY, PRIORITY):
        with _board(state_dir, board, create=False) as board_fd:
            if board_fd is not None:
                _each_gpu_dir(board_fd, lambda uuid, gpu_fd: _sweep_gpu(board, uuid, gpu_fd, allocations))


def _sweep_gpu(board: str, uuid: str, gpu_fd: int, allocations: dict[str, dict]) -> None:
    for entry in os.listdir(gpu_fd):
        if entry.startswith("."):
            _drop_stale_temp(gpu_fd, entry)
            continue
        owner = allocations.get(entry)
        if owner is None or (board == PRIORITY and owner.get("priority") != 0) or \
                uuid not in {d.get("uuid") for d in owner.get("devices", ())}:
            state_layout.remove_at(gpu_fd, entry)
