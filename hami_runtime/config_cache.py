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
"""
from __future__ import annotations

import json
import os

from .files import atomic_write, file_key, read_state_file

__all__ = ["file_key", "lookup", "store", "state_dir_hint"]

CACHE_DIR = "cache"
CONFIG_FILE = "config.json"
VERSION = 2
LIMIT = 256 * 1024  # as the launcher's config limit
DEFAULT_STATE_DIR = "/run/hami"
SETTLED_NS = 2_000_000_000  # a file changed more recently than this is not kept


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


def lookup(state_dir: str, key: list):
    """The values stored for this key in state_dir, or None."""
    if not state_dir:
        return None
    try:
        entry = json.loads(read_state_file(entry_path(state_dir), LIMIT))
    except Exception:  # missing, refused or not JSON: a miss
        return None
    if not isinstance(entry, dict) or entry.get("version") != VERSION or entry.get("key") != key \
            or entry.get("state_dir") != state_dir or not isinstance(entry.get("values"), dict):
        return None
    return entry["values"]


def store(state_dir: str, key: list, values: dict) -> None:
    """Keep the values for this key (making the state dir the config names, as
    the first GPU container would)."""
    try:
        data = json.dumps({"version": VERSION, "key": key, "state_dir": state_dir,
                           "values": values}, allow_nan=False).encode()
    except (TypeError, ValueError):  # not JSON (nan): not kept
        return
    if len(data) > LIMIT:
        return
    try:
        os.makedirs(os.path.join(state_dir, CACHE_DIR), mode=0o755, exist_ok=True)
        atomic_write(entry_path(state_dir), data, 0o644)
    except OSError:
        pass
