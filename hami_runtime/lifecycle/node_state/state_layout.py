"""Names and places in the state dir (store.py describes its layout): an
allocation's name (<id>@<root key>), its dirs under containers/ and private/,
opened and removed without following a link, the host PID the createRuntime
hook records; and the checks every stored record's names pass. Below the store,
the boards and the pod ledger, which all use it."""
from __future__ import annotations

import contextlib
import os
import stat

from ...errors import HamiError
from ...files import atomic_write, read_state_file, sha256_hex
from ...ids import check_container_id
from ...names import root_key as root_key_ok
from ... import path_trust

SUBDIRS = ("containers", "private")
PID_FILE = "pid"
MAX_DEVICES = 16
ROOT_KEY_LEN = 16
MAX_NAME = 255  # a file name's length (NAME_MAX): the name is one in containers/, private/, the board
MAX_ID = MAX_NAME - ROOT_KEY_LEN - 1


def root_key(runc_root: str) -> str:
    return sha256_hex(os.fsencode(runc_root))[:ROOT_KEY_LEN]


def alloc_name(runc_root: str, cid: str) -> str:
    """The allocation's name (state key and dir name) for a (runc root, id) pair.
    An id too long to name a file that way is refused (runc takes ids of up to
    1024 characters): before anything is written, so it leaves nothing behind."""
    if len(os.fsencode(check_container_id(cid))) > MAX_ID:
        raise HamiError("container id", cid, f"{len(cid)} characters: a GPU container's id may have "
                        f"at most {MAX_ID} (the runtime names its state files by it)")
    return f"{cid}@{root_key(runc_root)}"


def check_name(name) -> tuple[str, str]:
    """(container id, root key) of a well-formed allocation name."""
    cid, at, key = name.rpartition("@") if isinstance(name, str) else ("", "", "")
    if not at or not root_key_ok(key) or len(os.fsencode(name)) > MAX_NAME:
        raise HamiError("allocation name", name, f"must be <container id>@<16 hex digits>, "
                        f"at most {MAX_NAME} bytes")
    return check_container_id(cid), key


def _well_formed(name: str) -> bool:
    try:
        check_name(name)
    except HamiError:
        return False
    return True


def container_dir(state_dir: str, name: str) -> str:
    check_name(name)
    return os.path.join(state_dir, "containers", name)


def private_dir(state_dir: str, name: str) -> str:
    check_name(name)
    return os.path.join(state_dir, "private", name)


def id_of(name: str) -> str:
    return name.rpartition("@")[0]


def is_int(value, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def creator_problem(creator) -> str:
    """'' for the {pid, start} of the create that made an entry."""
    if not isinstance(creator, dict) or not is_int(creator.get("pid", 0), 0, 1 << 31) or not (
            creator.get("start") is None or is_int(creator.get("start"), 0, 1 << 62)):
        return f"creator={creator!r} is not {{pid, start}}"
    return ""


def stored_name_problem(name, runc_root, cid, what: str = "id") -> str:
    """'' when `name` is what the (runc root, `what`) pair is stored under, else why not."""
    if not isinstance(runc_root, str) or not os.path.isabs(runc_root):
        return f"runc_root={runc_root!r} is not an absolute path"
    try:
        expected = alloc_name(runc_root, cid)
    except HamiError as exc:
        return exc.line()
    if name != expected:
        return f"stored as {name!r}, but its runc root and {what} name it {expected!r}"
    return ""


def make_state_dir(state_dir: str) -> None:
    """The state dir, made if missing, refused when anyone but root could
    replace it or a dir above it, and kept host-only (path_trust.STATE_DIR_MODE)."""
    try:
        problem = path_trust.make_state_dir(state_dir)
    except OSError as exc:
        raise HamiError("config state_dir", state_dir, f"cannot use: {exc.strerror}") from None
    if problem:
        raise HamiError("config state_dir", state_dir,
                        f"{problem}: a user other than root could replace the node's state "
                        "(the state dir and every dir above it must be root's and not writable "
                        "by group or others)")


def subdir_fd(state_dir: str, sub: str, create: bool = False) -> int | None:
    """An fd on containers/ or private/, None when absent; a symlink there is refused."""
    path = os.path.join(state_dir, sub)
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o755)
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if os.path.islink(path):
            raise HamiError(path, "", "is a symbolic link: the state dir's subdirs must be "
                            "real directories (hamictl doctor --repair)") from None
        raise HamiError(path, "", f"not a directory: {exc.strerror}") from None


def subdir_names(state_dir: str, sub: str) -> list[str]:
    """The names in containers/ or private/, sorted; none when it is absent (a
    symlink there is refused, as subdir_fd refuses it)."""
    fd = subdir_fd(state_dir, sub)
    if fd is None:
        return []
    try:
        return sorted(os.listdir(fd))
    finally:
        os.close(fd)


def remove_at(dir_fd: int, name: str) -> None:
    """Remove `name` under dir_fd: a dir tree (never following a link inside
    it), or a link or file itself."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        import shutil  # only when there is a tree to remove
        shutil.rmtree(name, dir_fd=dir_fd, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)


def make_dirs(state_dir: str, name: str) -> tuple[str, str]:
    """Fresh containers/<name>/ and private/<name>/ (whatever was there goes)."""
    check_name(name)
    paths = []
    for sub in SUBDIRS:
        fd = subdir_fd(state_dir, sub, create=True)
        try:
            remove_at(fd, name)
            os.mkdir(name, 0o755, dir_fd=fd)
        finally:
            os.close(fd)
        paths.append(os.path.join(state_dir, sub, name))
    return paths[0], paths[1]


def remove_dirs(state_dir: str, name: str) -> None:
    check_name(name)
    for sub in SUBDIRS:
        fd = subdir_fd(state_dir, sub)
        if fd is None:
            continue
        try:
            remove_at(fd, name)
        finally:
            os.close(fd)


def record_host_pid(state_dir: str, name: str, pid: int) -> None:
    """What the createRuntime hook records (the launcher's C hook writes the
    same file): no lock, one atomic file; a container without a private dir
    has no allocation and nothing is written."""
    directory = private_dir(state_dir, name)
    if os.path.isdir(directory) and not os.path.islink(directory) \
            and not os.path.islink(os.path.dirname(directory)):
        atomic_write(os.path.join(directory, PID_FILE), f"{int(pid)}\n".encode(), 0o644)


def host_pid(state_dir: str, name: str) -> int:
    """The recorded host PID, 0 when none is (yet) or the file is not one."""
    try:
        text = read_state_file(os.path.join(private_dir(state_dir, name), PID_FILE), 64)
    except (OSError, HamiError):
        return 0
    text = text[:-1] if text.endswith(b"\n") else text
    return int(text) if text.isdigit() and text.isascii() else 0


def container_pid(state_dir: str, name: str, entry: dict) -> int:
    """The container's host PID as every hamictl command shows it: the entry's,
    else the one the createRuntime hook recorded (0: not known)."""
    return entry.get("pid") or host_pid(state_dir, name)


def runc_made(runc_root: str, cid: str) -> bool:
    """runc made this container: its state.json exists (it stays until delete)."""
    return os.path.lexists(os.path.join(runc_root, cid, "state.json"))
