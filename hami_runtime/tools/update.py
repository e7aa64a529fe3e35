"""hamictl update: resize a running container's GPU slice (memory, cores,
core policy, priority) without restarting it.

One allocator transaction: the record is checked and changed under the node
lock (lifecycle/commands/resize.py decides), the state file is written, and only then,
the lock still held, the container's limits file (host-only, read-only inside)
gets the new limits in place (one store per field, region.h). libvgpu reads the
limits live, so every process of the container follows at its next allocation,
launch or view. Any refusal leaves the record and the limits as they were. What
the container uses now is read from its region (container_files: never through
a link the container planted).
"""
from __future__ import annotations

import contextlib
import json
import os
import time

import click

from .. import config as config_mod
from ..errors import HamiError
from ..lifecycle.node_state import allocator, container_files, state_layout, store
from ..lifecycle.commands import resize
from ..policies import CORE_POLICIES
from . import json_output

MIB = 1 << 20


def apply_priority(state, name: str, entry: dict, priority: int, limits) -> None:
    """The one place a priority change goes through: the record now; once it is
    committed, the host's priority board (what libvgpu follows: one link or
    unlink per GPU) and the limits' priority field (what views show)."""
    from ..lifecycle.node_state import boards
    entry["priority"] = priority
    uuids = [d["uuid"] for d in entry["devices"]]
    state.after_commit.append(lambda: boards.set_priority(state.state_dir, name, uuids, priority))
    state.after_commit.append(lambda: limits.update_live(priority=priority))


def _used_now(state_dir: str, name: str, entry: dict) -> dict[str, int]:
    """Bytes the container's processes hold per GPU UUID, as its region says:
    every held slot except those the host knows to be gone (libvgpu reclaims
    those at its next charge). A region that cannot be read (replaced or removed
    from inside) holds nothing the host can believe: 0, so a shrink goes
    through, and the container's own accounting is its own business."""
    from ..node import region
    uuids = [d["uuid"] for d in entry["devices"]]
    try:
        with container_files.open_region(state_dir, name) as reg:
            procs = [p for p, alive in container_files.processes(state_dir, name, reg, len(uuids))
                     if alive is not False]
    except (region.RegionError, HamiError, OSError):
        return dict.fromkeys(uuids, 0)
    return {uuid: sum(p.devices[i].mem_used for p in procs) for i, uuid in enumerate(uuids)}


def _open_limits(state_dir: str, name: str, entry: dict):
    from ..node import region
    try:
        limits = container_files.open_limits(state_dir, name, writable=True)
    except (region.RegionError, HamiError, OSError) as exc:
        raise HamiError("container", entry["id"], f"its limits cannot be used ({exc}); "
                        "a create still in flight? try again") from None
    have = [d.uuid for d in limits.devices]
    if have != [d["uuid"] for d in entry["devices"]]:
        limits.close()
        raise HamiError("container", entry["id"], f"its limits name GPUs {have}, its record "
                        f"{[d['uuid'] for d in entry['devices']]}: run hamictl doctor")
    return limits


def _write_live(state_dir: str, name: str, limits, after: dict) -> None:
    """After the commit: the limits (every size and the policy, as the record now
    says: a field written with the value it holds is left as it was), then the
    host-only copy a rebuild reads."""
    limits.update_live(mem_limits={i: d["mem_mib"] * MIB for i, d in enumerate(after["devices"])},
                       sm_limits={i: d["cores"] for i, d in enumerate(after["devices"])},
                       core_policy=after["core_policy"])
    private = state_layout.private_dir(state_dir, name)
    if os.path.isdir(private) and not os.path.islink(private):
        from ..files import atomic_write
        resized = {k: after[k] for k in ("devices", "core_policy", "priority")}
        with contextlib.suppress(OSError):  # only a rebuild of a lost state file reads it
            atomic_write(os.path.join(private, store.RESIZED_FILE),
                         json.dumps(resized).encode(), 0o600)


def update(cfg, cid: str, change: resize.Change, runc_root: str | None = None,
           gpus=None) -> tuple[str, dict, dict, dict]:
    """(allocation name, record before, record after, bytes in use per GPU UUID
    when it was changed); HamiError on a refusal, with nothing changed."""
    if gpus is None:
        from ..node import discovery_cache
        gpus = discovery_cache.gpus(cfg)
    caps = {g.uuid: allocator.capacity(g, cfg.split_count, cfg.memory_scaling) for g in gpus}
    if runc_root is not None and not os.path.isabs(runc_root):
        raise HamiError("--root", runc_root, "must be an absolute path")
    if not os.path.isdir(cfg.state_dir):
        raise HamiError("container", cid, "has no GPU allocation on this node")
    limits = None
    try:
        with store.transaction(cfg.state_dir) as state:
            wanted = state_layout.alloc_name(runc_root, cid) if runc_root is not None else None
            name = resize.find(state.allocations, cid, wanted, state.invalid)
            before = state.allocations[name]
            limits = _open_limits(cfg.state_dir, name, before)
            used = _used_now(cfg.state_dir, name, before)
            others = [e for n, e in state.allocations.items() if n != name]
            blocked = allocator.blocked(state.invalid, state.allocations.values(), gpus, caps)
            after = resize.resize(before, change, caps, others, used, blocked)
            # the priority changes only through apply_priority
            after["priority"] = before["priority"]
            if change.priority is not None:
                apply_priority(state, name, after, change.priority, limits)
            after["updated_at"] = time.time()
            state.allocations[name] = after
            state.after_commit.insert(0, lambda: _write_live(cfg.state_dir, name, limits, after))
    finally:
        if limits is not None:
            limits.close()
    return name, before, after, used


def _describe(before: dict, after: dict) -> list[str]:
    def arrow(old, new, unit=""):
        return f"{old}{unit}" if old == new else f"{old}{unit} -> {new}{unit}"
    lines = [f"GPU {new['index']} {new['uuid']}: memory {arrow(old['mem_mib'], new['mem_mib'], 'MiB')}"
             f", cores {arrow(old['cores'], new['cores'], '%')}"
             for old, new in zip(before["devices"], after["devices"])]
    lines.append(f"core policy {arrow(before['core_policy'], after['core_policy'])}, "
                 f"priority {arrow(before['priority'], after['priority'])}")
    return lines


@click.command("update")
@click.argument("container")
@click.option("--gpumem", metavar="MIB", help="device memory per GPU, MiB")
@click.option("--gpumem-percentage", metavar="P", help="device memory per GPU, % of the card")
@click.option("--gpucores", metavar="P", help="SM share per GPU, % (0-100)")
@click.option("--priority", metavar="0|1", help="0 high, 1 low")
@click.option("--core-policy", metavar="|".join(CORE_POLICIES), help="SM policy")
@click.option("--device", metavar="UUID|INDEX", help="only this GPU of the container")
@click.option("--root", "runc_root", metavar="DIR",
              help="the runc root the container lives under (when two hold the same id)")
@click.option("--force", is_flag=True,
              help="set a memory limit below what the container uses now (nothing is freed)")
@click.option("--json", "as_json", is_flag=True, help="print the updated allocation as JSON")
@click.pass_context
def update_command(ctx, container, gpumem, gpumem_percentage, gpucores, priority, core_policy,
                   device, runc_root, force, as_json):
    """Resize a running container's GPU slice; its processes follow at their next
    allocation or launch."""
    change = resize.parse(gpumem, gpumem_percentage, gpucores, priority, core_policy, device,
                          force)
    cfg = config_mod.load(ctx.obj["config_path"])
    name, before, after, used = update(cfg, container, change, runc_root)
    for old, d in zip(before["devices"], after["devices"]):
        if d["mem_mib"] != old["mem_mib"] and used.get(d["uuid"], 0) > d["mem_mib"] * MIB:
            click.echo(f"hamictl: GPU {d['index']} ({d['uuid']}): the container uses "
                       f"{-(-used[d['uuid']] // MIB)} MiB, over its new {d['mem_mib']} MiB: its "
                       "allocations are refused until use falls below that", err=True)
    if as_json:
        pid = state_layout.container_pid(cfg.state_dir, name, after)
        click.echo(json_output.dumps({"name": name, **after, "pid": pid}))
    else:
        for line in _describe(before, after):
            click.echo(f"{after['id']}: {line}")
