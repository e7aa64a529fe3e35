"""hamictl: the operator's view of the node (GPUs, allocations).

Commands of other modules are named in OTHER_COMMANDS and imported only when
used: `hamictl update` must not pay for the metrics server's imports.
"""
from __future__ import annotations

import click

from .. import config as config_mod
from ..errors import HamiError
from ..version import DISTRIBUTION
from . import display_text, json_output


def _config(path):
    return config_mod.load(path, keep=False)  # a read-only tool keeps no cache entry


def _table(headers, rows) -> str:
    rows = [[display_text.one_line(str(c)) for c in row] for row in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)] if rows else \
        [len(h) for h in headers]
    line = lambda row: "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()
    return "\n".join([line(headers)] + [line(r) for r in rows])


def state_now(cfg):
    """(live allocations, invalid entries) as the state file has them, read
    without the allocator's lock and without writing (store.snapshot): dead
    entries, which the next create, delete or `hamictl doctor --repair` frees,
    are not shown; each invalid entry is reported on stderr, and so is a state
    file that is not one (then what the next create rebuilds is shown)."""
    from ..lifecycle.node_state import store
    try:
        state = store.snapshot(cfg.state_dir)
    except store.NotAStateFile as exc:
        display_text.echo(f"hamictl: {exc.line()}: shown as rebuilt from the running containers' "
                          "bundles (the next create or delete sets it aside and rebuilds it; so does "
                          "`hamictl doctor --repair`)", err=True)
        state = exc.rebuilt
    dead, gone = set(state.dead()), set(state.dead_invalid())
    allocations = {n: e for n, e in state.allocations.items() if n not in dead}
    invalid = {n: bad for n, bad in state.invalid.items() if n not in gone}
    for name, bad in sorted(invalid.items()):
        display_text.echo(f"hamictl: invalid state entry {name!r}: {bad['reason']} (it holds its "
                          "GPUs until `hamictl doctor --repair`)", err=True)
    return allocations, invalid


def allocations(cfg):
    return state_now(cfg)[0]


# command name -> (module in hami_runtime.tools, attribute)
OTHER_COMMANDS = {
    "top": ("top", "top_command"),
    "metrics": ("metrics", "metrics_command"),
    "doctor": ("doctor", "doctor_command"),
    "update": ("update", "update_command"),
    "agent": ("agent", "agent_command"),
    "device-plugin": ("device_plugin", "device_plugin_command"),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(OTHER_COMMANDS))

    def get_command(self, ctx, name):
        if name in OTHER_COMMANDS and name not in self.commands:
            import importlib
            module, attr = OTHER_COMMANDS[name]
            self.add_command(getattr(importlib.import_module(f"{__package__}.{module}"), attr), name)
        return super().get_command(ctx, name)


@click.group(cls=_LazyGroup)
@click.version_option(package_name=DISTRIBUTION, prog_name="hamictl",
                      message="%(prog)s version %(version)s")
@click.option("--config", "config_path", envvar="HAMI_CONFIG", default=None,
              help=f"config file (default $HAMI_CONFIG or {config_mod.DEFAULT_PATH})")
@click.pass_context
def cli(ctx, config_path):
    """Inspect GPU sharing on this node."""
    ctx.obj = {"config_path": config_path}
    CHOSEN["config_path"] = config_path


CHOSEN = {"config_path": None}  # what --config or HAMI_CONFIG named, for a refusal's line


def config_read() -> str:
    """The config file this run read ("" where none was: the defaults)."""
    import os
    chosen = CHOSEN["config_path"] or config_mod.config_path()
    return chosen if chosen != config_mod.DEFAULT_PATH or os.path.exists(chosen) else ""


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.pass_context
def gpus(ctx, as_json):
    """GPUs and MIG instances (GPU:MIG): index, UUID, model, memory, slots used,
    memory and cores allocated."""
    from ..lifecycle.node_state import allocator
    from ..node import discovery
    cfg = _config(ctx.obj["config_path"])
    found = discovery.load_gpus(cfg.nvml_library)
    live, invalid = state_now(cfg)
    used = allocator.usage(live.values())
    caps = {g.uuid: allocator.capacity(g, cfg.split_count, cfg.memory_scaling) for g in found}
    blocked = allocator.blocked(invalid, live.values(), found, caps)
    from . import node_view, top
    try:
        containers = top.read_all(cfg.state_dir)
    except click.ClickException:  # no region.h: no region's processes are known
        containers = []
    now = node_view.driver_columns(cfg, found, live, invalid, containers)
    rows = []
    for gpu in found:
        cap = caps[gpu.uuid]
        u = used.get(gpu.uuid, allocator.Usage())
        rows.append({"index": gpu.index, "name": gpu.name, "uuid": gpu.uuid, "model": gpu.model,
                     "mig_mode": gpu.mig_mode, "parent": gpu.parent,
                     "memory_mib": gpu.memory_mib, "capacity_mib": cap.mem_mib,
                     "slots": cap.slots, "slots_used": u.slots,
                     "memory_allocated_mib": u.mem_mib, "cores_allocated": u.cores,
                     "blocked": blocked.get(gpu.uuid, ""), **now.get(gpu.uuid, {})})
    if as_json:
        click.echo(json_output.dumps(rows))
        return
    lines = [_table(["INDEX", "UUID", "MODEL", "MEMORY", "SLOTS", "MEM ALLOC", "CORES ALLOC",
                     "DRIVER USED", "OUTSIDE SLICES", "UTIL"], [
        [r["name"], r["uuid"], r["model"], f"{r['memory_mib']}MiB",
         f"{r['slots_used']}/{r['slots']}", f"{r['memory_allocated_mib']}/{r['capacity_mib']}MiB",
         f"{r['cores_allocated']}%", node_view.or_unknown(r.get("driver_memory_used_mib"), "MiB"),
         node_view.or_unknown(r.get("memory_outside_mib"), "MiB"),
         node_view.or_unknown(r.get("utilization_pct"), "%")]
        for r in rows])]
    for r in rows:
        for h in r.get("containers", ()):
            lines.append(f"GPU {r['name']}: {h['id'][:12]} {node_view.shown_name(h)} {h['memory_mib']}MiB "
                         f"{h['cores']}% (request from {h['request_source'] or '?'})")
        if r.get("outside_pids"):
            lines.append(f"GPU {r['name']}: {r['memory_outside_mib']}MiB held outside every slice by "
                         f"pid {', '.join(map(str, r['outside_pids']))}")
        if not r.get("driver_read", True) and not r["parent"]:
            lines.append(f"GPU {r['name']}: driver not read: {r['driver_error']}")
        if r["blocked"]:
            lines.append(f"GPU {r['name']} takes no new allocation: {r['blocked']}")
        if r["mig_mode"]:
            lines.append(f"GPU {r['name']} is in MIG mode: its MIG instances are given, each whole, not it")
    display_text.echo("\n".join(lines))


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.pass_context
def ps(ctx, as_json):
    """Allocations: container, GPU, memory, cores, PID (and, while the node agent
    runs, what it found: over slice, frozen, killed N)."""
    from ..lifecycle.node_state import state_layout
    from ..node import agent_state
    from .node_view import container_meta, enforcement_of, identity_of, shown_name
    cfg = _config(ctx.obj["config_path"])
    agent = agent_state.current(cfg.state_dir)
    rows, shown = [], []  # shown: each row's name as gpus and top show it
    for name, entry in sorted(allocations(cfg).items(), key=lambda kv: (kv[1]["id"], kv[0])):
        pid = state_layout.container_pid(cfg.state_dir, name, entry)
        for device in entry["devices"]:
            shown.append(shown_name(container_meta(entry)))
            row = {"container": entry["id"], "runc_root": entry["runc_root"],
                   "gpu": device.get("index"), "uuid": device["uuid"],
                   "memory_mib": device["mem_mib"], "cores": device["cores"],
                   "pid": pid, "identity": identity_of(entry)}
            if agent is not None:  # only where an agent runs: the rows stay as they were without one
                row["enforcement"] = enforcement_of(agent, name, device["uuid"])
            rows.append(row)
    if as_json:
        click.echo(json_output.dumps(rows))
        return
    headers = ["CONTAINER", "GPU", "UUID", "MEMORY", "CORES", "PID", "NAME"]
    table = [[r["container"], r["gpu"], r["uuid"], f"{r['memory_mib']}MiB", f"{r['cores']}%",
              r["pid"] or "-", named] for r, named in zip(rows, shown)]
    if agent is not None:
        headers.append("ENFORCED")
        for line, r in zip(table, rows):
            line.append(", ".join(r["enforcement"]["flags"]) or "-")
    display_text.echo(_table(headers, table))


def main(argv=None) -> int:
    try:
        rc = cli.main(args=argv, standalone_mode=False)
        if isinstance(rc, int) and rc:  # ctx.exit(n) comes back as the return value
            return rc
    except HamiError as exc:
        from ..config_origin import explain
        click.echo(f"hamictl: {explain(exc, config_read()).line()}", err=True)
        return 1
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        return 1
    return 0

