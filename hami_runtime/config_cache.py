"""The validated config, kept in <state_dir>/cache/ so that a create need not
read TOML or validate it through the model (pydantic) while the file is the one
validated before.

An entry holds the config's values (every key, defaults filled in) under a key
made of the config file's identity (path, device, inode, size, mtime_ns and
ctime_ns, the same before and after reading the open file, its ctime at least
SETTLED_NS old) and the model file's (a new version of the runtime validates
again). It is written only into the state dir that the validated config names,
so an entry found in a directory that is not the config's own state dir is
never used. The state dir is found without TOML: the top-level
`state_dir = "..."` line, else the default; a file that sets it some other way
simply always misses. The entry is a state file (files.py: regular, root's or
ours, no symlink, bounded) in the host-only cache/ (no container mounts it);
its values are used as validated: whoever can write there can write the config
itself. Anything unexpected is a miss, and an entry that cannot be written is
not an error.

The state dir is normally a tmpfs (/run), emptied at every boot, while the
config file outlives the boot: so the same entry is also kept in
PERSISTENT_DIR, one file per config path (the defaults: per path looked for),
and used on a miss in the state dir under the same checks, and then copied
there. That directory is used only while it is a real directory of root's (or
ours) that no one else can write; it keeps the newest PERSISTENT_KEEP entries.
"""
from __future__ import annotations

import json
import os
import stat

from .files import atomic_write, file_key, read_state_file, sha256_hex

__all__ = ["file_key", "lookup", "store", "state_dir_hint"]

CACHE_DIR = "cache"
CONFIG_FILE = "config.json"
VERSION = 2
LIMIT = 256 * 1024  # as the launcher's config limit
DEFAULT_STATE_DIR = "/run/hami"
SETTLED_NS = 2_000_000_000  # a file changed more recently than this is not kept
PERSISTENT_DIR = "/var/cache/hami"  # kept over a reboot, unlike the state dir
PERSISTENT_KEEP = 64  # entries, one per config path: a node has few


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


def persistent_dir_trusted() -> bool:
    """PERSISTENT_DIR is a directory, not a symlink, root's or ours, and no
    one else may write in it (or swap its entries)."""
    try:
        st = os.lstat(PERSISTENT_DIR)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid in (0, os.geteuid()) and not st.st_mode & 0o022


def _read(path: str, state_dir: str, key: list):
    """(the entry's bytes, its values) where the entry at path is for this key
    and state dir, else None."""
    try:
        data = read_state_file(path, LIMIT)
        entry = json.loads(data)
    except Exception:  # missing, refused or not JSON: a miss
        return None
    if not isinstance(entry, dict) or entry.get("version") != VERSION or entry.get("key") != key \
            or entry.get("state_dir") != state_dir or not isinstance(entry.get("values"), dict):
        return None
    return data, entry["values"]


def _write(path: str, data: bytes) -> bool:
    """Whether the entry was written (an unwritable place is not an error)."""
    try:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        atomic_write(path, data, 0o644)
    except OSError:
        return False
    return True


def lookup(state_dir: str, key: list, config_path: str):
    """The values stored for this key in state_dir, else in the persistent
    entry for config_path (then copied into state_dir), or None."""
    if not state_dir:
        return None
    found = _read(entry_path(state_dir), state_dir, key)
    if found is None and persistent_dir_trusted():
        found = _read(persistent_path(config_path), state_dir, key)
        if found is not None:
            _write(entry_path(state_dir), found[0])
    return found[1] if found else None


def store(state_dir: str, key: list, values: dict, config_path: str) -> None:
    """Keep the values for this key (making the state dir the config names, as
    the first GPU container would), and their persistent copy for config_path."""
    try:
        data = json.dumps({"version": VERSION, "key": key, "state_dir": state_dir,
                           "values": values}, allow_nan=False).encode()
    except (TypeError, ValueError):  # not JSON (nan): not kept
        return
    if len(data) > LIMIT:
        return
    _write(entry_path(state_dir), data)
    try:
        os.makedirs(PERSISTENT_DIR, mode=0o755, exist_ok=True)
    except OSError:
        return
    if persistent_dir_trusted() and _write(persistent_path(config_path), data):
        _prune_persistent()


def _prune_persistent() -> None:
    """Remove the oldest persistent entries (by mtime) beyond PERSISTENT_KEEP."""
    try:
        with os.scandir(PERSISTENT_DIR) as entries:
            kept = sorted(((e.stat(follow_symlinks=False).st_mtime_ns, e.path) for e in entries
                           if e.name.startswith("config-") and e.name.endswith(".json")),
                          reverse=True)
    except OSError:
        return
    for _, path in kept[PERSISTENT_KEEP:]:
        try:
            os.unlink(path)
        except OSError:
            pass
