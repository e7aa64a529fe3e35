"""hamictl doctor: check the state dir with the allocator's own rules, and
with --repair put it right, printing every finding.

Findings: a state or lock file that is not a regular file of ours (a symlink,
a FIFO, a device, too large, foreign-owned), a state file that does not
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
import time
from typing import List

import click

from ..errors import HamiError
from ..files import read_state_file
from ..lifecycle import allocator, state_layout, store


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


def check_entries(cfg, repair: bool, out: List[str]) -> None:
    gpus = []
    try:
        from ..node import discovery
        gpus = discovery.load_gpus(cfg.nvml_library)
    except Exception as exc:  # no NVML: the fields are still checked
        out.append(f"GPUs: not read ({type(exc).__name__}: {exc}); sizes not checked against them")
    caps = {g.uuid: allocator.capacity(g, cfg.split_count, cfg.memory_scaling) for g in gpus}
    with store.transaction(cfg.state_dir, reconcile=False) as state:
        rebuilt = store.rebuild(cfg.state_dir) if (state.invalid and repair) else {}
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
                    out.append(f"entry {name!r}: its container is gone"
                               + ("; freed" if repair else ""))
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
        if not repair:
            raise _NoWrite()
    with store.transaction(cfg.state_dir):
        pass  # frees the dead and the orphaned


class _NoWrite(Exception):
    """Leaves a transaction without writing (doctor without --repair)."""


def orphans(state_dir: str, out: List[str]) -> None:
    try:
        with store.transaction(state_dir, reconcile=False) as state:
            keep = set(state.allocations) | set(state.invalid)
            raise _NoWrite(keep)
    except _NoWrite as stop:
        keep = stop.args[0]
    for sub in state_layout.SUBDIRS:
        path = os.path.join(state_dir, sub)
        if os.path.islink(path) or not os.path.isdir(path):
            continue
        for name in sorted(os.listdir(path)):
            if name not in keep and "@" in name:
                out.append(f"{os.path.join(path, name)}: no allocation owns it")


def old_layout(state_dir: str, repair: bool, out: List[str]) -> None:
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
            out.append(line)


def doctor(cfg, repair: bool) -> List[str]:
    out: List[str] = []
    if not os.path.isdir(cfg.state_dir):
        return [f"{cfg.state_dir}: no state dir (nothing allocated yet)"]
    check_files(cfg.state_dir, repair, out)
    if not repair and out:
        return out  # the allocator would refuse these: nothing more can be read safely
    if not repair:
        orphans(cfg.state_dir, out)
    try:
        old_layout(cfg.state_dir, repair, out)
    except (OSError, HamiError) as exc:
        out.append(f"{cfg.state_dir}: {exc}")
    try:
        check_entries(cfg, repair, out)
    except _NoWrite:
        pass
    return out


@click.command("doctor")
@click.option("--repair", is_flag=True, help="put what is found right")
@click.pass_context
def doctor_command(ctx, repair):
    """Check the allocator's state dir (and repair it with --repair)."""
    from .. import config
    cfg = config.load(ctx.obj["config_path"])
    found = doctor(cfg, repair)
    for line in found:
        click.echo(line)
    if not found:
        click.echo(f"{cfg.state_dir}: state is sound")
    elif not repair:
        ctx.exit(1)
