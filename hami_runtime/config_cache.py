"""The validated config, kept in <state_dir>/cache/ so that a create need not
read TOML or validate it through the model (pydantic) while the file is the one
validated before.

An entry holds the config's values (every key, defaults filled in) for the
config file's identity (path, device, inode, size, mtime_ns and ctime_ns, the
same before and after reading the open file, its ctime at least SETTLED_NS
old), the sha256 of the bytes that were validated, the model file's identity
(a new version of the runtime validates again) and the state dir. All of it is
bound by an HMAC-SHA256 made with this node's cache key, KEY_DIR/KEY_FILE: 32
random bytes made on first use, readable by root (or the runtime's own user)
only, in a directory that is neither under /var/cache nor under /run, where a
container given a hostPath could write. An entry is used only when its MAC is
right and every bound field is what this lookup has in hand (the file just
read, hashed); so whoever cannot read the key cannot make or edit an entry,
and an entry copied from another node, another state dir or another config
is a miss. An entry whose MAC is wrong, or that cannot be read as one, is
refused: the caller validates the file and writes one line per refusal in the
runtime's log. Without a usable key (KEY_DIR a symlink, someone else's or
writable by others; the key file not a regular 0600 file of ours of the right
size) nothing is read from the cache nor written to it.

The entry lives in the state dir that the validated config names; the state
dir is found without TOML: the top-level `state_dir = "..."` line, else the
default; a file that sets it some other way simply always misses. The entry
is a state file (files.py: regular, root's or ours, no symlink, bounded).

The state dir is normally a tmpfs (/run), emptied at every boot, while the
config file outlives the boot: so the same entry is also kept in
PERSISTENT_DIR, one file per config path (the defaults: per path looked for),
and used on a miss in the state dir under the same checks, and then copied
there. That directory is used only while it is a real directory of root's (or
ours) that no one else can write. Each store prunes it: entries that are not
this version's, whose MAC is wrong (another node's, or made with a key since
removed), whose config file is gone, beyond the newest PERSISTENT_KEEP, and
temp files a killed writer left.

The read-only tools (hamictl ps, gpus, top, metrics, doctor) look up without
keeping (lookup's `keep`): no key made, no entry written or copied.
"""
from __future__ import annotations

import errno
import hmac
import json
import os
import stat
import time

from .errors import HamiError
from .files import atomic_write, file_key, read_state_file, sha256_hex
from .path_trust import make_state_dir, replace_problem

__all__ = ["file_key", "lookup", "store", "state_dir_hint", "cache_key"]

CACHE_DIR = "cache"
CONFIG_FILE = "config.json"
VERSION = 3
LIMIT = 256 * 1024  # as the launcher's config limit
DEFAULT_STATE_DIR = "/run/hami"
SETTLED_NS = 2_000_000_000  # a file changed more recently than this is not kept
PERSISTENT_DIR = "/var/cache/hami"  # kept over a reboot, unlike the state dir
PERSISTENT_KEEP = 64  # entries, one per config path: a node has few
# root's only: containers are given hostPaths of /var/cache and /run, never this
KEY_DIR = "/var/lib/hami"
KEY_FILE = "cache-key"
KEY_SIZE = 32
MAC_CONTEXT = b"hami-runtime config cache\0"  # a MAC made with this key for nothing else
TEMP_PREFIX = ".hami-"  # files.temp_beside's
TEMP_STALE_NS = 60_000_000_000  # a writer takes milliseconds: older temp files are a killed one's
NO_CONFIG_FILE = "no config file"  # config.py's file key for the defaults


class Refused(Exception):
    """Why the cache key cannot be used (one sentence)."""


def state_dir_hint(text: bytes) -> str:
    """The top-level `state_dir = "/..."` (a plain one-line string), else the default."""
    for line in text.split(b"\n"):
        line = line.strip()
        if line.startswith(b"["):
            break
        if not line.startswith(b"state_dir"):
            continue
        name, _, value = line.partition(b"=")
        value = value.strip()
        if name.strip() != b"state_dir" or not value.startswith(b'"'):
            return ""
        end = value.find(b'"', 1)
        if end < 0 or b"\\" in value[:end]:
            return ""
        rest = value[end + 1:].strip()
        if rest and not rest.startswith(b"#"):
            return ""
        try:
            hint = value[1:end].decode("utf-8")
        except UnicodeDecodeError:
            return ""
        return os.path.normpath(hint) if os.path.isabs(hint) else ""
    return DEFAULT_STATE_DIR


def entry_path(state_dir: str) -> str:
    return os.path.join(state_dir, CACHE_DIR, CONFIG_FILE)


def persistent_path(config_path: str) -> str:
    """The persistent entry for the config at (or looked for at) config_path."""
    name = sha256_hex(os.fsencode(config_path))[:16]
    return os.path.join(PERSISTENT_DIR, f"config-{name}.json")


def key_path() -> str:
    return os.path.join(KEY_DIR, KEY_FILE)


def _ours(st) -> bool:
    return st.st_uid in (0, os.geteuid())


def persistent_dir_problem() -> str:
    """'' when PERSISTENT_DIR is a directory, not a symlink, root's or ours,
    that no one else may write in (or swap its entries), in dirs no one else
    may change (path_trust); else why not."""
    try:
        above = replace_problem(os.path.dirname(PERSISTENT_DIR))
        if above:
            return above
        st = os.lstat(PERSISTENT_DIR)
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return exc.strerror
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory (a symbolic link?)"
    if not _ours(st):
        return f"owned by uid {st.st_uid}"
    return "writable by group or others" if st.st_mode & 0o022 else ""


def persistent_dir_trusted() -> bool:
    return not persistent_dir_problem()


def _open_key_dir(make: bool = True) -> int:
    """An fd of KEY_DIR (made 0700 where missing, unless not `make`: then
    FileNotFoundError), checked: a real directory, root's or ours, that no one
    else may write in, in dirs no one else may change (path_trust)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        above = replace_problem(os.path.dirname(KEY_DIR))
        if above:
            raise Refused(above)
        fd = os.open(KEY_DIR, flags)
    except FileNotFoundError:
        if not make:
            raise
        try:
            os.makedirs(os.path.dirname(KEY_DIR), mode=0o755, exist_ok=True)
            os.mkdir(KEY_DIR, 0o700)
        except FileExistsError:
            pass  # another process made it: checked below as any other
        except OSError as exc:
            raise Refused(f"cannot make {KEY_DIR}: {exc.strerror}") from None
        try:
            fd = os.open(KEY_DIR, flags)
        except OSError as exc:
            raise Refused(f"cannot open {KEY_DIR}: {exc.strerror}") from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Refused(f"{KEY_DIR} is not a directory (a symbolic link?)") from None
        raise Refused(f"cannot open {KEY_DIR}: {exc.strerror}") from None
    st = os.fstat(fd)
    why = ""
    if not _ours(st):
        why = f"{KEY_DIR} is owned by uid {st.st_uid}, not root"
    elif st.st_mode & 0o022:
        why = f"{KEY_DIR} is writable by group or others"
    if why:
        os.close(fd)
        raise Refused(why)
    return fd


def _read_key(dir_fd: int) -> bytes:
    """The key file's bytes, where it is a regular file of root's (or ours)
    that no one else may read or write, of KEY_SIZE bytes."""
    try:
        fd = os.open(KEY_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
                     | os.O_NOCTTY, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refused(f"{key_path()} is a symbolic link") from None
        raise Refused(f"cannot open {key_path()}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{key_path()} is not a regular file")
        if not _ours(st):
            raise Refused(f"{key_path()} is owned by uid {st.st_uid}, not root")
        if st.st_mode & 0o077:
            raise Refused(f"{key_path()} has mode {stat.S_IMODE(st.st_mode):04o}, not 0600")
        data = os.read(fd, KEY_SIZE + 1)
    finally:
        os.close(fd)
    if len(data) != KEY_SIZE:
        raise Refused(f"{key_path()} holds {len(data)} bytes, not {KEY_SIZE} (remove it: "
                      "the next create makes a new one)")
    return data


def _remove_stale_temps(directory: str, dir_fd=None) -> None:
    """Temp files (files.temp_beside's) that a killed writer left in directory
    (opened as dir_fd, where given)."""
    now = time.time_ns()
    try:
        names = os.listdir(directory if dir_fd is None else dir_fd)
    except OSError:
        return
    for name in names:
        if not name.startswith(TEMP_PREFIX):
            continue
        target = name if dir_fd is not None else os.path.join(directory, name)
        try:
            if now - os.stat(target, dir_fd=dir_fd, follow_symlinks=False).st_mtime_ns > TEMP_STALE_NS:
                os.unlink(target, dir_fd=dir_fd)
        except OSError:
            pass


def _make_key(dir_fd: int) -> None:
    """A new key, written in full and then linked into place, which never
    replaces a key another process made first."""
    _remove_stale_temps(KEY_DIR, dir_fd)
    temp = f"{TEMP_PREFIX}{os.getpid()}-{os.urandom(6).hex()}"
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(os.urandom(KEY_SIZE))
                handle.flush()
                os.fchmod(handle.fileno(), 0o600)
                os.fsync(handle.fileno())
            try:
                os.link(temp, KEY_FILE, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except FileExistsError:
                pass
            os.fsync(dir_fd)
        finally:
            os.unlink(temp, dir_fd=dir_fd)
    except OSError as exc:
        raise Refused(f"cannot write {key_path()}: {exc.strerror}") from None


def cache_key(make: bool = True) -> bytes:
    """This node's cache key, made on first use (FileNotFoundError where there is
    none and not `make`); Refused says why it cannot be used."""
    dir_fd = _open_key_dir(make)
    try:
        try:
            return _read_key(dir_fd)
        except FileNotFoundError:
            if not make:
                raise
            _make_key(dir_fd)
            return _read_key(dir_fd)
    finally:
        os.close(dir_fd)


def _canonical(body) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _mac(secret: bytes, body_bytes: bytes) -> str:
    return hmac.new(secret, MAC_CONTEXT + body_bytes, "sha256").hexdigest()


def _bound(config_path: str, text: bytes, key: list, state_dir: str) -> dict:
    """What an entry must have been made for to be used for this lookup."""
    return {"config": config_path, "sha256": sha256_hex(text), "key": key, "state_dir": state_dir}


def _parse(data: bytes, secret: bytes):
    """(body, '') of an entry whose MAC is right, else (None, why it is refused)."""
    try:
        entry = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json reads
        return None, "not JSON"
    if not isinstance(entry, dict) or set(entry) != {"version", "mac", "body"}:
        return None, "not a config cache entry"
    if entry["version"] != VERSION:
        version = entry["version"]
        shown = version if type(version) is int and abs(version) < 1 << 32 else "unknown"
        return None, f"format version {shown}, not {VERSION}"
    body = entry["body"]
    try:
        made = _mac(secret, _canonical(body))
    except (TypeError, ValueError, RecursionError):
        return None, "its body is not canonical JSON"
    if not isinstance(entry["mac"], str) or not hmac.compare_digest(made, entry["mac"]):
        return None, "its MAC does not match this node's cache key (edited, forged or another node's)"
    if not isinstance(body, dict) or not isinstance(body.get("values"), dict):
        return None, "its body holds no values"
    return body, ""


def _verified(path: str, secret: bytes, bound: dict, refusals: list):
    """(the entry's bytes, its values) where the entry at path is ours and made
    for `bound`; None otherwise, with a (level, line) in refusals where an
    entry was there but could not be trusted."""
    try:
        data = read_state_file(path, LIMIT)
    except FileNotFoundError:
        return None
    except (HamiError, OSError) as exc:
        why = exc.reason if isinstance(exc, HamiError) else exc.strerror
        refusals.append(("warning", f"config cache: refused {path}: {why}"))
        return None
    body, why = _parse(data, secret)
    if body is None:
        level = "info" if why.startswith("format version") else "warning"
        refusals.append((level, f"config cache: refused {path}: {why}"))
        return None
    if any(body.get(name) != value for name, value in bound.items()):
        return None  # ours, for another file, another state dir or an earlier config: a miss
    return data, body["values"]


def _write_state_entry(state_dir: str, data: bytes) -> bool:
    """_write into the state dir, where no one but root could replace it (path_trust)."""
    try:
        if make_state_dir(state_dir):
            return False
    except OSError:
        return False
    return _write(entry_path(state_dir), data)


def _write(path: str, data: bytes) -> bool:
    """Whether the entry was written (an unwritable place is not an error)."""
    try:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        atomic_write(path, data, 0o644)
    except OSError:
        return False
    return True


def lookup(state_dir: str, key: list, config_path: str, text: bytes, keep: bool = True):
    """(values, refusals): the values stored for this key, the config's bytes
    `text` and state_dir, in state_dir's entry, else in the persistent entry
    for config_path (then copied into state_dir, where `keep`), or None; and a
    (level, line) for the runtime's log for each entry (or key) that could not
    be trusted. Without `keep` (the read-only tools) nothing is written: no key
    is made (none is a miss), no entry copied."""
    refusals = []
    if not state_dir:
        return None, refusals
    try:
        secret = cache_key(make=keep)
    except FileNotFoundError:
        return None, refusals
    except Refused as exc:
        return None, [("warning", f"config cache: not used: {exc}")]
    bound = _bound(config_path, text, key, state_dir)
    found = _verified(entry_path(state_dir), secret, bound, refusals)
    if found is None and persistent_dir_trusted():
        found = _verified(persistent_path(config_path), secret, bound, refusals)
        if found is not None and keep:
            _write_state_entry(state_dir, found[0])
    return (found[1] if found else None), refusals


def store(state_dir: str, key: list, values: dict, config_path: str, text: bytes) -> None:
    """Keep the values validated from `text` for this key (making the state dir
    the config names, as the first GPU container would), and their persistent
    copy for config_path."""
    try:
        secret = cache_key()
    except Refused:  # lookup has said why
        return
    try:
        body = _canonical({**_bound(config_path, text, key, state_dir), "values": values})
    except (TypeError, ValueError):  # not JSON (nan): not kept
        return
    data = b'{"version":%d,"mac":"%s","body":%s}' % (VERSION, _mac(secret, body).encode(), body)
    if len(data) > LIMIT:
        return
    if _write_state_entry(state_dir, data):
        _remove_stale_temps(os.path.dirname(entry_path(state_dir)))
    try:
        os.makedirs(PERSISTENT_DIR, mode=0o755, exist_ok=True)
    except OSError:
        return
    if persistent_dir_trusted() and _write(persistent_path(config_path), data):
        prune_persistent(secret)


def _worth_keeping(path: str, secret: bytes) -> bool:
    """An entry of this version, MAC'd with this key, at its own config
    path's name, for a config file that still exists (or for the defaults)."""
    try:
        body, _ = _parse(read_state_file(path, LIMIT), secret)
    except (HamiError, OSError):
        return False
    if body is None or not isinstance(body.get("config"), str) \
            or persistent_path(body["config"]) != path or not isinstance(body.get("key"), list):
        return False
    config_key = body["key"][0] if body["key"] else None
    return config_key == [NO_CONFIG_FILE, body["config"]] or os.path.exists(body["config"])


def prune_persistent(secret: bytes) -> None:
    """Remove from PERSISTENT_DIR the entries not worth keeping, the oldest
    (by mtime) beyond PERSISTENT_KEEP, and stale temp files."""
    _remove_stale_temps(PERSISTENT_DIR)
    kept = []
    try:
        with os.scandir(PERSISTENT_DIR) as entries:
            found = [e.path for e in entries
                     if e.name.startswith("config-") and e.name.endswith(".json")]
    except OSError:
        return
    for path in found:
        try:
            if _worth_keeping(path, secret):
                kept.append((os.lstat(path).st_mtime_ns, path))
            else:
                os.unlink(path)
        except OSError:
            pass
    for _, path in sorted(kept, reverse=True)[PERSISTENT_KEEP:]:
        try:
            os.unlink(path)
        except OSError:
            pass
