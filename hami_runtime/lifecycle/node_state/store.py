"""The allocator's state file: one JSON file under the state dir, changed only
under an fcntl lock and replaced atomically.

Layout of the state dir:
  allocations.json    {"version": 2, "allocations": {<name>: entry},
                       "invalid": {<name>: {"entry": ..., "reason": ...}},
                       "pods": {<sandbox id>@<root key>: what the runtime
                                remembers of a Kubernetes pod's containers
                                (pod_ledger.py)}}
  allocations.lock    the lock (a separate file, so the rename keeps it valid)
  containers/<name>/  the region dir, mounted read-write into the container
                      (container_files.py: never trusted, never followed)
  private/<name>/     host-only files: limits (mounted read-only), region.json
                      (the region's identity), ld.so.preload, owner.json, pid (the
                      container's host PID, written by the createRuntime hook),
                      resized.json (devices, policy, priority after hamictl update)
  activity/<uuid>/    the activity board: links to every GPU container's
                      activity stamps (boards.py)
  priority/<uuid>/    the priority board: links to high-priority containers'
                      activity stamps; both boards' entries are freed with the
                      allocation, and swept of entries no allocation owns

An allocation belongs to a (runc root, container id) pair: containerd keeps a
runc root per namespace and two namespaces may use the same id. Its <name> is
"<id>@<root key>", the root key a hash of the root's path.

An entry is live while the process that made it (hami-runtime, which becomes
runc by exec) still runs, or while runc's state for it exists
(<runc root>/<id>/state.json: runc made the container). A runc dir without
state.json whose creator is gone is a create killed half-way. Dead entries
are freed at the start of every transaction, so a SIGKILL anywhere leaks
nothing past the next operation. The read-only tools (hamictl ps, gpus, top,
metrics, doctor without --repair) take no transaction: snapshot() reads the
file as the last one left it, and they leave out the dead themselves.

Every state file is untrusted input: read only as a regular file owned by
root (or us), never through a symlink, bounded in size; every field of every
entry is checked. An entry that fails the checks is kept apart as invalid
(hamictl shows it, `hamictl doctor` repairs it) and never counts as free
capacity. Deleting never follows a symlink inside the state dir. A corrupt
state file is rebuilt from live containers' bundles (their config.json holds
the allocation as the hami.io/allocation annotation).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import sys
import time
from collections.abc import Iterator

from ...errors import HamiError
from ...files import _kind, atomic_write, open_state_file, process_alive, read_state_file
from ...ids import check_container_id
from ...names import gpu_uuid
from ...policies import CORE_POLICIES
from .state_layout import (
    MAX_DEVICES, SUBDIRS, alloc_name, creator_problem, is_int, make_state_dir, remove_at, remove_dirs,
    runc_made, stored_name_problem, subdir_fd, subdir_names, _well_formed)

VERSION = 2
STATE_FILE = "allocations.json"
LOCK_FILE = "allocations.lock"
MARKER = "hami.io/allocation"
OWNER_FILE = "owner.json"
RESIZED_FILE = "resized.json"  # hamictl update's sizes, over the bundle's (rebuild)
MAX_STATE_BYTES = 16 << 20
MAX_SMALL_FILE = 64 << 10
MAX_MEM_MIB = 1 << 30


def entry_problem(name, entry) -> str:
    """'' for a well-formed entry stored under `name`, else what is wrong."""
    if not isinstance(entry, dict):
        return "entry is not an object"
    why = stored_name_problem(name, entry.get("runc_root"), entry.get("id"))
    if why:
        return why
    if not isinstance(entry.get("bundle"), str):
        return f"bundle={entry.get('bundle')!r} is not a path"
    devices = entry.get("devices")
    if not isinstance(devices, list) or not 1 <= len(devices) <= MAX_DEVICES:
        return f"devices must be a list of 1 to {MAX_DEVICES} GPUs"
    for i, d in enumerate(devices):
        if not isinstance(d, dict) or set(d) != {"index", "uuid", "mem_mib", "cores"}:
            return f"devices[{i}] must have exactly index, uuid, mem_mib, cores"
        if not isinstance(d["uuid"], str) or not gpu_uuid(d["uuid"]):
            return f"devices[{i}].uuid={d['uuid']!r} is not a GPU UUID"
        for field, low, high in (("index", 0, 1023), ("mem_mib", 1, MAX_MEM_MIB),
                                 ("cores", 0, 100)):
            if not is_int(d[field], low, high):
                return f"devices[{i}].{field}={d[field]!r} is not a whole number in {low}..{high}"
    if len({d["uuid"] for d in devices}) != len(devices):
        return "devices name the same GPU twice"
    if entry.get("core_policy") not in CORE_POLICIES:
        return f"core_policy={entry.get('core_policy')!r} is not one of {', '.join(CORE_POLICIES)}"
    if entry.get("priority") not in (0, 1) or isinstance(entry.get("priority"), bool):
        return f"priority={entry.get('priority')!r} is not 0 or 1"
    if not isinstance(entry.get("oversubscribe", True), bool):  # older entries lack it
        return f"oversubscribe={entry.get('oversubscribe')!r} is not true or false"
    if not is_int(entry.get("pid", 0), 0, 1 << 31):
        return f"pid={entry.get('pid')!r} is not a process id"
    why = creator_problem(entry.get("creator", {}))
    if why or "pod" not in entry:
        return why
    from . import pod_ledger  # only for a Kubernetes pod's container
    return pod_ledger.entry_problem(entry)


def runc_running(runc_root: str, cid: str) -> bool:
    """runc's container still has its init process (created, running or paused; not
    stopped): the pid and start time in its state.json name a live process."""
    data = read_json(os.path.join(runc_root, cid, "state.json"), MAX_STATE_BYTES)
    if not isinstance(data, dict):
        return False
    return process_alive(data.get("init_process_pid"), data.get("init_process_start"))


def _creator_or_container(entry: dict, container_test) -> bool:
    """The entry's create still runs, or container_test(runc root, id) holds for
    its container. Any field may be anything (invalid entries are asked too)."""
    creator = entry.get("creator")
    creator = creator if isinstance(creator, dict) else {}
    if process_alive(creator.get("pid", 0), creator.get("start")):
        return True
    root, cid = entry.get("runc_root"), entry.get("id")
    if not isinstance(root, str) or not os.path.isabs(root):
        return False
    try:
        check_container_id(cid)
    except HamiError:
        return False
    return container_test(root, cid)


def entry_alive(entry: dict) -> bool:
    """Its create runs or runc has its container (running or not)."""
    return _creator_or_container(entry, runc_made)


def entry_running(entry: dict) -> bool:
    """Its create runs or its container does (a stopped container that runc still
    keeps holds its entry, but does not run)."""
    return _creator_or_container(entry, runc_running)


def read_json(path: str, limit: int = MAX_SMALL_FILE):
    try:
        return json.loads(read_state_file(path, limit))
    except (OSError, ValueError, HamiError):
        return None


def _bundle_of(root: str, cid: str):
    data = read_json(os.path.join(root, cid, "state.json"), MAX_STATE_BYTES)
    labels = ((data or {}).get("config") or {}).get("labels") if isinstance(data, dict) else None
    for label in labels if isinstance(labels, list) else ():
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


def rebuild(state_dir: str) -> dict[str, dict]:
    """Allocations of the live GPU containers, read back from their bundles.
    Only containers that have our host-side private dir count, so an
    annotation a user wrote cannot claim a GPU."""
    found: dict[str, dict] = {}
    for name in subdir_names(state_dir, "private"):
        owner = read_json(os.path.join(state_dir, "private", name, OWNER_FILE))
        if not isinstance(owner, dict):
            continue
        root, cid, creator = owner.get("runc_root"), owner.get("id"), owner.get("creator")
        if not isinstance(root, str) or not isinstance(cid, str) or not os.path.isabs(root):
            continue
        try:
            # A dir named by the id alone is a container made before allocations
            # had a runc root: it is accounted under its new name, its dir kept.
            if name not in (alloc_name(root, cid), cid):
                continue
        except HamiError:
            continue
        name = alloc_name(root, cid)
        creator = creator if isinstance(creator, dict) else {}
        if process_alive(creator.get("pid", 0), creator.get("start")):
            bundle = owner.get("bundle")  # a create still running (before runc made its dir)
        elif runc_made(root, cid):
            bundle, creator = _bundle_of(root, cid), {}
        else:
            continue
        entry = _marker_of(bundle) if isinstance(bundle, str) else None
        if isinstance(entry, dict) and entry.get("id") == cid:
            entry.update(runc_root=root, bundle=bundle, creator=creator)
            resized = read_json(os.path.join(state_dir, "private", name, RESIZED_FILE))
            if isinstance(resized, dict):  # checked with the rest by entry_problem
                entry.update({k: resized[k] for k in ("devices", "core_policy", "priority")
                              if k in resized})
            if not entry_problem(name, entry):
                found[name] = entry
    return found


class State:
    def __init__(self, state_dir: str, allocations: dict[str, dict], invalid: dict[str, dict],
                 pods: dict[str, dict] | None = None, pod_problems: dict[str, str] | None = None):
        self.state_dir = state_dir
        self.allocations = allocations
        self.invalid = invalid          # name -> {"entry": as found, "reason": why}
        self.pods = pods if pods is not None else {}   # pod_ledger.py
        self.pod_problems = pod_problems or {}         # pod key -> why its record was dropped
        self.freed: list = []
        # Run after the state file is written, the lock still held (hamictl
        # update writes a container's region only once its record is durable).
        self.after_commit: list = []

    def dead(self) -> list[str]:
        """Names of the allocations whose container is gone (reconcile frees them)."""
        return [n for n, e in self.allocations.items() if not entry_alive(e)]

    def dead_invalid(self) -> list[str]:
        """Names of the invalid entries reconcile drops: the container each names is gone."""
        return [n for n, bad in self.invalid.items()
                if isinstance(bad.get("entry"), dict) and not entry_alive(bad["entry"])
                and isinstance(bad["entry"].get("runc_root"), str)
                and isinstance(bad["entry"].get("id"), str)]

    def reconcile(self) -> None:
        for name in self.dead():
            self.release(name)
        # An invalid entry is dropped once the container it names (if any) is gone.
        for name in self.dead_invalid():
            self.invalid.pop(name)
            self.freed.append(name)
        # Temp files of an interrupted atomic write (only written under this lock).
        for entry in os.scandir(self.state_dir):
            if entry.name.startswith(".hami-"):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
        # Dirs that no entry owns come from a crash between steps: drop them.
        # A name of another form (a dir from before allocations had a runc root,
        # which a live container may still mount) is left to hamictl doctor.
        keep = set(self.allocations) | set(self.invalid)
        for sub in SUBDIRS:
            fd = subdir_fd(self.state_dir, sub)
            if fd is None:
                continue
            try:
                for name in os.listdir(fd):
                    if name not in keep and _well_formed(name):
                        with contextlib.suppress(OSError):
                            remove_at(fd, name)
            finally:
                os.close(fd)
        from . import boards
        boards.sweep(self.state_dir, self.allocations)
        if self.pods:
            from . import pod_ledger
            for key in [k for k, ledger in self.pods.items() if not pod_ledger.alive(ledger)]:
                self.pods.pop(key)

    def release(self, name: str) -> bool:
        """Frees the allocation; its files go too where they can (one that cannot
        be removed is left to hamictl doctor and never stops the transaction)."""
        from . import boards
        entry = self.allocations.pop(name, None)
        with contextlib.suppress(OSError, HamiError):
            boards.clear(self.state_dir, name)
        with contextlib.suppress(OSError, HamiError):
            remove_dirs(self.state_dir, name)
        if entry is not None:
            self.freed.append(name)
        return entry is not None

    def to_json(self) -> dict:
        data = {"version": VERSION, "allocations": self.allocations}
        if self.invalid:
            data["invalid"] = self.invalid
        if self.pods:
            data["pods"] = self.pods
        return data


def parse_state(data) -> tuple[dict[str, dict], dict[str, dict]] | None:
    """(valid entries, invalid ones with the reason), None for a file that is
    not a state file at all."""
    if not isinstance(data, dict) or data.get("version") != VERSION:
        return None
    allocations, invalid = data.get("allocations"), data.get("invalid", {})
    if not isinstance(allocations, dict) or not isinstance(invalid, dict):
        return None
    good: dict[str, dict] = {}
    bad: dict[str, dict] = {}
    for name, entry in allocations.items():
        why = entry_problem(name, entry)
        if why:
            bad[name] = {"entry": entry, "reason": why}
        else:
            good[name] = entry
    for name, item in invalid.items():
        if isinstance(item, dict) and isinstance(item.get("reason"), str):
            bad.setdefault(name, {"entry": item.get("entry"), "reason": item["reason"]})
        else:
            bad.setdefault(name, {"entry": item, "reason": "unreadable invalid entry"})
    return good, bad


def _load(state_dir: str) -> State:
    path = os.path.join(state_dir, STATE_FILE)
    data = parsed = None
    try:
        raw = read_state_file(path, MAX_STATE_BYTES)
    except FileNotFoundError:
        raw = None
    if raw is not None:
        try:
            data = json.loads(raw)
            parsed = parse_state(data)
        except ValueError:
            parsed = None
        if parsed is None:
            # Keep the bad file for the operator, then rebuild from what runs. No
            # config (so no log file) is at hand here: one line to stderr, which
            # the engine keeps as it keeps the runtime's other errors.
            aside = f"{path}.corrupt-{int(time.time())}"
            with contextlib.suppress(OSError):
                os.replace(path, aside)
                print(f"hami-runtime: {path}: not a state file; set aside as {aside}, "
                      "rebuilt from the running containers' bundles", file=sys.stderr, flush=True)
    return _state_of(state_dir, data, parsed)


def _state_of(state_dir: str, data, parsed) -> State:
    """The State of a parsed file, or (parsed None: no file, or one set aside) what the
    running containers' bundles hold; its pods' ledgers read or rebuilt."""
    state = State(state_dir, *(parsed or (rebuild(state_dir), {})))
    if parsed is not None and "pods" in data:
        from . import pod_ledger
        state.pods, state.pod_problems = pod_ledger.parse(data["pods"])
    if any("pod" in entry for entry in state.allocations.values()):
        from . import pod_ledger
        pod_ledger.rebuild(state.pods, state.allocations)
    return state


def snapshot(state_dir: str) -> State:
    """The state as the last transaction left it, for the read-only tools: no
    lock taken, nothing created, changed, freed or set aside. Every write is an
    atomic rename (files.atomic_write), so the file read is one whole version.
    An absent state dir is nothing allocated, an absent file what the running
    containers' bundles hold (as a transaction rebuilds it); dead entries are kept
    (State.dead() names them: the next transaction frees them). A file that is
    not a state file raises HamiError; its `rebuilt` is what the next
    transaction would rebuild from the running containers' bundles."""
    _check_lock(os.path.join(state_dir, LOCK_FILE))
    for sub in SUBDIRS:  # a symlink there is refused, as every transaction refuses it
        fd = subdir_fd(state_dir, sub)
        if fd is not None:
            os.close(fd)
    path = os.path.join(state_dir, STATE_FILE)
    try:
        raw = read_state_file(path, MAX_STATE_BYTES)
    except FileNotFoundError:
        raw = None
    except NotADirectoryError:
        raise HamiError("config state_dir", state_dir, "is not a directory") from None
    except OSError as exc:
        raise HamiError(path, "", f"cannot read: {exc.strerror}") from None
    data = parsed = None
    if raw is not None:
        try:
            data = json.loads(raw)
            parsed = parse_state(data)
        except (ValueError, RecursionError):
            parsed = None
        if parsed is None:
            raise NotAStateFile(path, State(state_dir, rebuild(state_dir), {}))
    return _state_of(state_dir, data, parsed)


def _check_lock(path: str) -> None:
    """The lock, where there is one, is what open_lock would accept (looked at,
    not opened): else the HamiError every create now meets."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return
    if stat.S_ISLNK(st.st_mode):
        raise HamiError(path, "", "is a symbolic link: state files must be regular files")
    if not stat.S_ISREG(st.st_mode):
        raise HamiError(path, "", f"is {_kind(st.st_mode)}: state files must be regular files")
    if st.st_uid not in (0, os.geteuid()):
        raise HamiError(path, "", f"is owned by uid {st.st_uid}: state files must be root's (or ours)")


class NotAStateFile(HamiError):
    """The state file is not one (snapshot): `rebuilt` is what the running
    containers' bundles say is allocated."""

    def __init__(self, path: str, rebuilt: State):
        super().__init__(path, "", f"is not a version {VERSION} state file")
        self.rebuilt = rebuilt


def open_lock(state_dir: str) -> int:
    make_state_dir(state_dir)
    try:
        return open_state_file(os.path.join(state_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT)
    except OSError as exc:
        raise HamiError("config state_dir", state_dir, f"cannot use: {exc.strerror}") from None


@contextlib.contextmanager
def transaction(state_dir: str, reconcile: bool = True) -> Iterator[State]:
    """Lock, load (or rebuild), free dead entries, yield; on a clean exit
    write the state back atomically if it changed. A state file that is not
    one is refused (the lock is released on the way out)."""
    lock_fd = open_lock(state_dir)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        state = _load(state_dir)
        before = json.dumps([state.allocations, state.invalid, state.pods], sort_keys=True)
        if reconcile:
            state.reconcile()
        yield state
        # A pod record that failed its checks was set apart at load: written out without it.
        if json.dumps([state.allocations, state.invalid, state.pods], sort_keys=True) != before or \
                state.pod_problems or not os.path.exists(os.path.join(state_dir, STATE_FILE)):
            atomic_write(os.path.join(state_dir, STATE_FILE),
                         (json.dumps(state.to_json(), sort_keys=True) + "\n").encode(),
                         0o644)
        for step in state.after_commit:
            step()
    finally:
        os.close(lock_fd)


def release(state_dir: str, runc_root: str, cid: str) -> bool:
    """Free the (root, id) allocation if its container is gone (idempotent).
    A live container, or a create still in flight, keeps it: the lock orders
    this against the create. An id no allocation can be named by has none."""
    try:
        name = alloc_name(runc_root, cid)
    except HamiError:
        return False
    with transaction(state_dir) as state:
        return name in state.freed


def discard(state_dir: str, name: str, creator: dict) -> bool:
    """A create that fails after committing its entry takes it back: only its
    own entry, and only while runc has not made the container."""
    with transaction(state_dir) as state:
        entry = state.allocations.get(name)
        if entry is None or entry.get("creator") != creator or \
                runc_made(entry["runc_root"], entry["id"]):
            return False
        return state.release(name)
