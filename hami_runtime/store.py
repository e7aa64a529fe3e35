"""The allocator's state file: one JSON file under the state dir, changed only
under an fcntl lock and replaced atomically.

Layout of the state dir:
  allocations.json    {"version": 1, "allocations": {<container id>: entry}}
  allocations.lock    the lock (a separate file, so the rename keeps it valid)
  containers/<id>/    the shared-region dir, mounted into the container
  private/<id>/       host-only files: ld.so.preload, owner.json, pid (the
                      container's host PID, written by the createRuntime hook)

An entry is live while runc's state dir for it exists (<runc root>/<id>) or
while the process that made it (hami-runtime, which becomes runc by exec)
still runs. Dead entries are freed at the start of every transaction, so a
SIGKILL anywhere leaks nothing past the next operation. A missing or corrupt
state file is rebuilt from live containers' bundles (their config.json holds
the allocation as the hami.io/allocation annotation).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from typing import Dict, Iterable, Iterator

from .errors import HamiError
from .files import atomic_write, process_alive
from .ids import check_container_id

VERSION = 1
STATE_FILE = "allocations.json"
LOCK_FILE = "allocations.lock"
MARKER = "hami.io/allocation"
PID_FILE = "pid"


def container_dir(state_dir: str, cid: str) -> str:
    return os.path.join(state_dir, "containers", check_container_id(cid))


def private_dir(state_dir: str, cid: str) -> str:
    return os.path.join(state_dir, "private", check_container_id(cid))


def record_host_pid(state_dir: str, cid: str, pid: int) -> None:
    """What the createRuntime hook records (the launcher's C hook writes the
    same file): no lock, one atomic file; a container without a private dir
    has no allocation and nothing is written."""
    directory = private_dir(state_dir, cid)
    if os.path.isdir(directory):
        atomic_write(os.path.join(directory, PID_FILE), f"{int(pid)}\n".encode(), 0o644)


def host_pid(state_dir: str, cid: str) -> int:
    """The recorded host PID, 0 when none is (yet)."""
    try:
        with open(os.path.join(private_dir(state_dir, cid), PID_FILE), encoding="ascii") as handle:
            text = handle.read()
    except (OSError, ValueError):
        return 0
    return int(text) if text.strip().isdigit() else 0


def entry_alive(entry: dict) -> bool:
    root, cid = entry.get("runc_root"), entry.get("id")
    if root and cid and os.path.isdir(os.path.join(root, cid)):
        return True
    creator = entry.get("creator") or {}
    return process_alive(creator.get("pid", 0), creator.get("start"))


def remove_dirs(state_dir: str, cid: str) -> None:
    for path in (container_dir(state_dir, cid), private_dir(state_dir, cid)):
        shutil.rmtree(path, ignore_errors=True)


def _valid_state(data) -> bool:
    if not isinstance(data, dict) or data.get("version") != VERSION:
        return False
    allocations = data.get("allocations")
    if not isinstance(allocations, dict):
        return False
    for cid, entry in allocations.items():
        if not isinstance(entry, dict) or entry.get("id") != cid:
            return False
        devices = entry.get("devices")
        if not isinstance(devices, list) or not all(
                isinstance(d, dict) and isinstance(d.get("uuid"), str)
                and isinstance(d.get("mem_mib"), int) and isinstance(d.get("cores"), int)
                for d in devices):
            return False
    return True


def _bundle_of(root: str, cid: str):
    try:
        with open(os.path.join(root, cid, "state.json"), encoding="utf-8") as handle:
            labels = json.load(handle).get("config", {}).get("labels", [])
    except (OSError, ValueError, AttributeError):
        return None
    for label in labels or ():
        if isinstance(label, str) and label.startswith("bundle="):
            return label[len("bundle="):]
    return None


def _marker_of(bundle: str):
    try:
        with open(os.path.join(bundle, "config.json"), encoding="utf-8") as handle:
            value = json.load(handle).get("annotations", {}).get(MARKER)
        return json.loads(value) if isinstance(value, str) else None
    except (OSError, ValueError, AttributeError):
        return None


def rebuild(state_dir: str, roots: Iterable[str]) -> Dict[str, dict]:
    """Allocations of the live GPU containers, read back from their bundles.
    Only containers that have our host-side private dir count, so an
    annotation a user wrote cannot claim a GPU."""
    private = os.path.join(state_dir, "private")
    ids = sorted(os.listdir(private)) if os.path.isdir(private) else []
    roots = set(roots)
    owners: Dict[str, dict] = {}
    for cid in ids:
        try:
            with open(os.path.join(private, cid, "owner.json"), encoding="utf-8") as handle:
                owners[cid] = json.load(handle)
            roots.add(owners[cid]["runc_root"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    found: Dict[str, dict] = {}
    # A create still running (before runc made its dir) is live too.
    for cid, owner in owners.items():
        creator = owner.get("creator") if isinstance(owner, dict) else None
        if isinstance(creator, dict) and process_alive(creator.get("pid", 0), creator.get("start")):
            entry = _marker_of(owner.get("bundle", ""))
            if isinstance(entry, dict) and entry.get("id") == cid:
                entry.update(runc_root=owner.get("runc_root"), bundle=owner.get("bundle"),
                             creator=creator)
                found[cid] = entry
    for root in sorted(r for r in roots if isinstance(r, str)):
        for cid in ids:
            if cid in found or not os.path.isdir(os.path.join(root, cid)):
                continue
            bundle = _bundle_of(root, cid)
            entry = _marker_of(bundle) if bundle else None
            if isinstance(entry, dict) and entry.get("id") == cid:
                entry.update(runc_root=root, bundle=bundle, creator={})
                found[cid] = entry
    if not _valid_state({"version": VERSION, "allocations": found}):
        return {}
    return found


class State:
    def __init__(self, state_dir: str, allocations: Dict[str, dict]):
        self.state_dir = state_dir
        self.allocations = allocations
        self.freed: list = []

    def reconcile(self) -> None:
        for cid in [c for c, e in self.allocations.items() if not entry_alive(e)]:
            self.release(cid)
        # Temp files of an interrupted atomic write (only written under this lock).
        for name in os.listdir(self.state_dir):
            if name.startswith(".hami-"):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.state_dir, name))
        # Dirs that no entry owns come from a crash between steps: drop them.
        for sub in ("containers", "private"):
            base = os.path.join(self.state_dir, sub)
            for cid in (os.listdir(base) if os.path.isdir(base) else ()):
                if cid not in self.allocations:
                    shutil.rmtree(os.path.join(base, cid), ignore_errors=True)

    def release(self, cid: str) -> bool:
        entry = self.allocations.pop(cid, None)
        remove_dirs(self.state_dir, cid)
        if entry is not None:
            self.freed.append(cid)
        return entry is not None

    def to_json(self) -> dict:
        return {"version": VERSION, "allocations": self.allocations}


def _load(state_dir: str, roots: Iterable[str]) -> Dict[str, dict]:
    path = os.path.join(state_dir, STATE_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        if _valid_state(data):
            return data["allocations"]
    except FileNotFoundError:
        return rebuild(state_dir, roots)
    except (OSError, ValueError):
        pass
    # Keep the bad file for the operator, then rebuild from what runs.
    with contextlib.suppress(OSError):
        os.replace(path, f"{path}.corrupt-{int(time.time())}")
    return rebuild(state_dir, roots)


@contextlib.contextmanager
def transaction(state_dir: str, roots: Iterable[str] = (), reconcile: bool = True
                ) -> Iterator[State]:
    """Lock, load (or rebuild), free dead entries, yield; on a clean exit
    write the state back atomically if it changed."""
    try:
        os.makedirs(state_dir, mode=0o755, exist_ok=True)
        lock_fd = os.open(os.path.join(state_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise HamiError("config state_dir", state_dir, f"cannot use: {exc.strerror}") from None
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        allocations = _load(state_dir, roots)
        before = json.dumps(allocations, sort_keys=True)
        state = State(state_dir, allocations)
        if reconcile:
            state.reconcile()
        yield state
        if json.dumps(state.allocations, sort_keys=True) != before or not os.path.exists(
                os.path.join(state_dir, STATE_FILE)):
            atomic_write(os.path.join(state_dir, STATE_FILE),
                         (json.dumps(state.to_json(), indent=1, sort_keys=True) + "\n").encode(),
                         0o644)
    finally:
        os.close(lock_fd)


def release(state_dir: str, cid: str, roots: Iterable[str] = ()) -> bool:
    """Free the container's allocation (idempotent)."""
    with transaction(state_dir, roots) as state:
        return state.release(check_container_id(cid))
