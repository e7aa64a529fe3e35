"""hamictl doctor: the node's health check. It names the config it read and
checks what a GPU create needs (the config, the real runtime, libvgpu, the
GPUs through NVML), says whether the create server listens, and checks the state dir with the allocator's own rules; with
--repair it puts the state right, printing every finding.

Exit status 0 on a healthy node, one where nothing was ever allocated
included; 1 only for faults it names. Notes (a dead entry, a dir no entry
owns: what the next create or delete frees) are shown, and are no fault.
Without --repair it writes nothing: the state is read as the other read-only
tools read it (store.snapshot), and the config as they load it (no cache kept).

Findings: a state dir that a user other than root could replace (it or a dir
above it theirs, or writable by group or others), a state or lock file that is
not a regular file of ours (a symlink, a FIFO, a device, too large,
foreign-owned), a state file that does not
parse, a containers/ or private/ that is a symlink, invalid entries (bad
fields, or sizes and UUIDs that do not fit this node's GPUs), invalid pod
records, dead entries and dirs no entry owns. Repair moves a bad file aside (renaming never follows
a link), replaces a symlinked subdir with a real one, rebuilds an invalid
entry from its live container's bundle or drops it, then runs one allocator
transaction, which frees the dead and the orphaned.
"""
from __future__ import annotations

import json
import os
import stat
import time
from typing import List, NamedTuple

import click

from ..errors import HamiError
from ..files import read_state_file
from ..lifecycle.node_state import allocator, state_layout, store
from ..path_trust import STATE_DIR_MODE, replace_problem
from . import display_text, json_output


def _aside(path: str) -> str:
    target = f"{path}.bad-{int(time.time())}"
    os.rename(path, target)
    return target


def check_files(state_dir: str, repair: bool, out: List[str]) -> None:
    for name, limit in ((store.LOCK_FILE, 0), (store.STATE_FILE, store.MAX_STATE_BYTES)):
        path = os.path.join(state_dir, name)
        if not os.path.lexists(path):
            continue
        try:
            data = read_state_file(path, limit if limit else 1 << 20)
            if name == store.STATE_FILE and store.parse_state(json.loads(data)) is None:
                raise HamiError(path, "", f"is not a version {store.VERSION} state file")
        except (HamiError, ValueError) as exc:
            line = exc.line() if isinstance(exc, HamiError) else f"{path}: not JSON: {exc}"
            if repair:
                line += f"; moved aside to {_aside(path)}"
            out.append(line)
    for sub in state_layout.SUBDIRS:
        path = os.path.join(state_dir, sub)
        if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
            line = f"{path}: is {'a symbolic link' if os.path.islink(path) else 'not a directory'}"
            if repair:
                os.unlink(path)
                os.mkdir(path, 0o755)
                line += "; replaced by an empty directory"
            out.append(line)


def check_entries(cfg, gpus, repair: bool, out: List[str], notes: List[str]) -> None:
    """gpus: this node's ([] where NVML could not be read: the fields are still checked).
    Without --repair the state is read as the tools read it (store.snapshot: no
    lock file made, nothing written or freed)."""
    caps = {g.uuid: allocator.capacity(g, cfg.split_count, cfg.memory_scaling) for g in gpus}
    if not repair:
        try:
            _entries(cfg.state_dir, store.snapshot(cfg.state_dir), gpus, caps, False, out, notes)
        except HamiError as exc:
            out.append(exc.line())
        return
    with store.transaction(cfg.state_dir, reconcile=False) as state:
        _entries(cfg.state_dir, state, gpus, caps, True, out, notes)
    with store.transaction(cfg.state_dir):
        pass  # frees the dead and the orphaned


def _entries(state_dir: str, state, gpus, caps, repair: bool, out: List[str], notes: List[str]) -> None:
    """check_entries' findings on `state`, which --repair puts right in it."""
    rebuilt = store.rebuild(state_dir) if (state.invalid and repair) else {}
    for name, entry in list(state.allocations.items()):
        for d in entry["devices"]:
            cap = caps.get(d["uuid"])
            why = ""
            if gpus and cap is None:
                why = f"GPU {d['uuid']} is not on this node"
            elif cap is not None and d["mem_mib"] > cap.mem_mib:
                why = f"holds {d['mem_mib']} MiB of GPU {d['uuid']}, which has {cap.mem_mib}"
            if why:
                state.invalid[name] = {"entry": state.allocations.pop(name), "reason": why}
                break
        else:
            if not store.entry_alive(entry):
                notes.append(f"entry {name!r}: its container is gone" + (
                    "; freed" if repair else
                    "; the next create or delete frees it (so does hamictl doctor --repair)"))
    for key, why in sorted(state.pod_problems.items()):
        out.append(f"pod record {key!r}: invalid: {why}" + (
            "; dropped (rebuilt, incomplete, from its allocations where any names its pod)"
            if repair else ""))
    for name, bad in sorted(state.invalid.items()):
        line = f"entry {name!r}: invalid: {bad['reason']}"
        if repair:
            state.invalid.pop(name)
            if name in rebuilt:
                state.allocations[name] = rebuilt[name]
                line += "; rebuilt from its container's bundle"
            else:
                line += "; dropped"
        out.append(line)


def orphans(state_dir: str, notes: List[str]) -> None:
    try:
        state = store.snapshot(state_dir)
    except HamiError:
        return  # check_entries names it
    keep = set(state.allocations) | set(state.invalid)
    for sub in state_layout.SUBDIRS:
        path = os.path.join(state_dir, sub)
        if os.path.islink(path) or not os.path.isdir(path):
            continue
        for name in sorted(os.listdir(path)):
            if name not in keep and "@" in name:
                notes.append(f"{os.path.join(path, name)}: no allocation owns it; the next "
                             "create or delete removes it (so does hamictl doctor --repair)")


def old_layout(state_dir: str, repair: bool, notes: List[str]) -> None:
    """Dirs named by the id alone (made before allocations had a runc root): a
    live container may still mount one, so only --repair removes those whose
    container is gone."""
    for sub in state_layout.SUBDIRS:
        path = os.path.join(state_dir, sub)
        if os.path.islink(path) or not os.path.isdir(path):
            continue
        for name in sorted(os.listdir(path)):
            if "@" in name:
                continue
            owner = store.read_json(os.path.join(state_dir, "private", name, store.OWNER_FILE))
            root = owner.get("runc_root") if isinstance(owner, dict) else None
            live = isinstance(root, str) and os.path.isabs(root) and state_layout.runc_made(root, name)
            line = f"{os.path.join(path, name)}: not an allocation name" + (
                " (a container made before allocations had a runc root; still there)" if live else "")
            if repair and not live:
                fd = state_layout.subdir_fd(state_dir, sub)
                try:
                    state_layout.remove_at(fd, name)
                finally:
                    os.close(fd)
                line += "; removed"
            notes.append(line)


class Report(NamedTuple):
    """faults: what is wrong (exit 1); notes: worth knowing, no fault; checks:
    (name, what was found) of each check that passed, the state dir's last."""
    faults: List[str]
    notes: List[str]
    checks: List[tuple]
    gpus: int | None = None
    allocations: int | None = None


def check_state(cfg, gpus, repair: bool, faults: List[str], notes: List[str]):
    """The state dir's findings go to faults (notes with --repair, which puts
    each right); returns what it holds, in words, and its allocations (None
    where a fault keeps it from being read)."""
    problem = replace_problem(cfg.state_dir)
    if problem:
        faults.append(f"{cfg.state_dir}: {problem}: a user other than root could replace the "
                      "node's state; creates are refused until the state dir is somewhere only "
                      "root can write")
        return "", None
    if not os.path.lexists(cfg.state_dir):
        return f"{cfg.state_dir}: no state dir yet: nothing was ever allocated on this node", 0
    if not os.path.isdir(cfg.state_dir):
        faults.append(f"{cfg.state_dir}: the state dir is not a directory")
        return "", None
    mode = stat.S_IMODE(os.stat(cfg.state_dir).st_mode)
    if mode != STATE_DIR_MODE:
        notes.append(f"{cfg.state_dir}: mode {mode:04o} lets other users reach the containers' "
                     f"regions; the allocator's next operation makes it {STATE_DIR_MODE:04o}")
    found: List[str] = []
    check_files(cfg.state_dir, repair, found)
    if not repair and found:
        faults.extend(found)  # the allocator would refuse these: nothing more can be read safely
        return "", None
    if not repair:
        orphans(cfg.state_dir, notes)
    try:
        old_layout(cfg.state_dir, repair, notes)
    except (OSError, HamiError) as exc:
        found.append(f"{cfg.state_dir}: {exc}")
    check_entries(cfg, gpus, repair, found, notes)
    if found and not repair:
        faults.extend(found)
        return "", None
    notes.extend(found)
    held = allocations_held(cfg.state_dir)
    return f"{cfg.state_dir}: state is sound, {held} allocation(s)", held


def allocations_held(state_dir: str) -> int | None:
    """The entries the state file holds (dead ones included, until freed)."""
    try:
        return len(store.snapshot(state_dir).allocations)
    except HamiError:
        return None


def check_log(cfg, faults: List[str], checks: List[tuple]) -> None:
    """The runtime's log can be written (a log that cannot never fails a create,
    so its refusals would go unseen)."""
    from ..config_origin import explain
    if not cfg.log_file:
        checks.append(("log", "none (config log_file is empty)"))
        return
    target = cfg.log_file if os.path.lexists(cfg.log_file) else os.path.dirname(cfg.log_file)
    planted = replace_problem(os.path.dirname(cfg.log_file))
    why = ""
    if os.path.isdir(cfg.log_file):
        why = "is a directory"
    elif planted:
        why = f"{planted}: a user other than root could replace the log"
    elif not os.access(target, os.W_OK):
        why = f"cannot be written ({target} {'is not writable' if os.path.exists(target) else 'does not exist'})"
    if why:
        faults.append(explain(HamiError("config log_file", cfg.log_file, why), cfg.path).line())
        return
    checks.append(("log", f"{cfg.log_file} ({cfg.log_level} and above)"))


def check_gpus(cfg, faults: List[str], checks: List[tuple]) -> list:
    """This node's GPUs through NVML ([] and a fault where it cannot say)."""
    from ..config_origin import explain
    try:
        from ..node import discovery
        gpus = discovery.load_gpus(cfg.nvml_library)
    except HamiError as exc:
        faults.append(f"GPUs: not read: {explain(exc, cfg.path).line()}")
        return []
    except Exception as exc:  # whatever NVML does, one line
        faults.append(f"GPUs: not read: {type(exc).__name__}: {exc}")
        return []
    if not gpus:
        faults.append("GPUs: NVML reports none on this node")
        return []
    checks.append(("GPUs", f"{len(gpus)}: " + ", ".join(f"{g.name} {g.model} {g.memory_mib} MiB"
                                                       for g in gpus)))
    return gpus


def check_visible_devices_alone(cfg, gpus, checks: List[tuple]) -> None:
    """What NVIDIA_VISIBLE_DEVICES=all with no size gets on this node (a stock
    CUDA image, docker --gpus): NVIDIA's runtime gives whole cards, this node
    may give a slice of each. Information, never a fault."""
    name = "NVIDIA_VISIBLE_DEVICES=all"
    policy = cfg.visible_devices_alone
    if policy == "none":
        checks.append((name, 'no GPU: such a create is refused (config visible_devices_alone = "none")'))
        return
    if policy == "whole":
        checks.append((name, 'every GPU, whole (config visible_devices_alone = "whole")'))
        return
    from ..lifecycle.node_state import allocator
    whole = [g for g in gpus if not g.is_mig and not g.mig_mode]
    if cfg.default_memory_mib:
        what = f"{cfg.default_memory_mib} MiB of each GPU"
        why = f"config default_memory_mib = {cfg.default_memory_mib}"
    else:
        percent = max(1, 100 // cfg.split_count)
        what = f"a {percent} % slice of each GPU"
        why = f"1/split_count of the card, split_count = {cfg.split_count}"
    sizes = sorted({(allocator.capacity(g, cfg.split_count, cfg.memory_scaling).mem_mib, g.memory_mib)
                    for g in whole})
    if sizes and not cfg.default_memory_mib:
        what += " (" + ", ".join(f"{cap * percent // 100} MiB of {mib} MiB" for cap, mib in sizes) + ")"
    checks.append((name, f"{what}, not the whole card ({why}; config visible_devices_alone = "
                   '"whole" gives whole cards)'))


def check_server(cfg, checks: List[tuple]) -> None:
    """Whether the create server of the state dir listens (its absence is no
    fault: the next create starts it)."""
    import socket
    import struct
    from ..lifecycle.serving import create_server
    if not cfg.create_server_idle_s:
        checks.append(("create server", "off (config create_server_idle_s = 0)"))
        return
    path = create_server.socket_path(cfg.state_dir)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
            pid = struct.unpack("3i", probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        except OSError:
            checks.append(("create server", "not running (the next create starts it)"))
            return
    checks.append(("create server", f"pid {pid}, at {path}; ends after {cfg.create_server_idle_s} s "
                   "without a create while no GPU container lives"))


def check_agent(cfg, checks: List[tuple]) -> None:
    """Whether the node agent runs on the state dir (its lock held; no fault where
    it does not: libvgpu still holds each slice, the driver's count is not kept)."""
    from . import agent
    pid = agent.holder(cfg.state_dir)
    if pid:
        checks.append(("agent", f"pid {pid}, every {cfg.agent_interval_ms} ms (memory: "
                       f"{cfg.memory_enforcement}, SM: {cfg.sm_enforcement})"))
    else:
        checks.append(("agent", "not running (hamictl agent): slices are held by libvgpu alone, not by the "
                       "driver's count"))


def doctor(cfg, repair: bool) -> Report:
    from .. import config
    from ..config_origin import explain
    faults: List[str] = []
    notes: List[str] = []
    checks = [("config", cfg.path or f"none: no file at {config.DEFAULT_PATH} and HAMI_CONFIG is "
               "unset; every key at its default")]
    try:
        checks.append(("runtime", config.real_runtime(cfg)))
    except HamiError as exc:
        faults.append(explain(exc, cfg.path).line())
    if os.path.isfile(cfg.libvgpu):
        checks.append(("libvgpu", cfg.libvgpu))
    else:
        faults.append(explain(HamiError("config libvgpu", cfg.libvgpu, "file not found"), cfg.path).line())
    check_log(cfg, faults, checks)
    check_server(cfg, checks)
    check_agent(cfg, checks)
    gpus = check_gpus(cfg, faults, checks)
    check_visible_devices_alone(cfg, gpus, checks)
    state, held = check_state(cfg, gpus, repair, faults, notes)
    if state:
        checks.append(("state", state))
    return Report(faults, notes, checks, len(gpus) if gpus else None, held)


@click.command("doctor")
@click.option("--repair", is_flag=True, help="put what is found in the state dir right")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.pass_context
def doctor_command(ctx, repair, as_json):
    """The node's health check: the config read, the runtime, libvgpu, the GPUs
    and the allocator's state dir (repaired with --repair). Exit status 0 when
    healthy, 1 for the faults it names."""
    from .. import config
    try:
        cfg = config.load(ctx.obj["config_path"], keep=False)
    except HamiError as exc:
        report = Report([exc.line()], [], [])
    else:
        report = doctor(cfg, repair)
    if as_json:
        click.echo(json_output.dumps({
            "healthy": not report.faults, "faults": report.faults, "notes": report.notes,
            "checks": dict(report.checks), "gpus": report.gpus, "allocations": report.allocations}))
    else:
        # faults first: a probe that keeps the first line (node-problem-detector) shows one
        for line in report.faults:
            display_text.echo(f"fault: {line}")
        state = [found for name, found in report.checks if name == "state"]
        for name, found in report.checks:
            if name != "state":
                display_text.echo(f"{name}: {found}")
        for line in report.notes:
            display_text.echo(f"note: {line}")
        for line in state:  # last: what most runs end with
            display_text.echo(line)
    if report.faults:
        ctx.exit(1)
