"""One command of runc's command line, as hami-runtime runs it: create/run
allocate and edit the spec, delete releases, everything else becomes runc at
once. Run in a Python of its own (hami_runtime/cli.py) or in a child of the create server.

The import path stays light (no pydantic, pynvml, jsonschema) until a
create or run needs them.
"""
from __future__ import annotations

import os
import sys

from ... import argv as argv_mod
from ... import config, phases
from ...errors import HamiError, report
from ...version import wants_command_help

LAUNCHER_ENV = "HAMI_LAUNCHER"  # hami_runtime/launcher/hook.h


def run(argv: list, creator: int, become) -> int:
    """One command of runc's command line: its exit status, or
    become(runtime, argv) where the real runtime takes over (os.execv, or the
    create server's answer to the launcher, which execs it). `creator`: the
    process that becomes the runtime (a create's allocation lives while it does)."""
    # Set by the C launcher for create/run; not passed on to runc.
    launcher = os.environ.pop(LAUNCHER_ENV, None)
    if phases.current is None:  # the create server's child began it at the launcher's request
        started = phases.launcher_started()
        phases.begin(started)
        if started is not None:
            phases.mark("launcher_python")  # the launcher, then this interpreter's start
            phases.note("a Python of its own (no create server answered)")
    inv = cfg = None
    try:
        inv = argv_mod.parse(argv)
        # runc prints its help or its version (--help, --version) and runs no subcommand
        shown = _print_help(inv) or \
            (("version" in inv.global_flags or "v" in inv.global_flags) and _print_version(inv))
        cfg = config.load()
        runtime = config.real_runtime(cfg)
        phases.mark("config")
        if shown or wants_command_help(inv):
            pass  # runc prints what was asked and runs nothing
        elif inv.command in ("create", "run"):
            from ..commands.create import prepare
            prepare(cfg, inv, launcher, creator)
            phases.write(cfg, inv.container_id)
        elif inv.command == "delete":
            from ..commands.delete import delete
            return delete(cfg, inv, runtime)
        become(runtime, [runtime] + argv)
        return 0
    except HamiError as exc:
        if exc.field.startswith("config ") or exc.field == "NVML":
            from ...config_origin import explain
            exc = explain(exc, cfg.path if cfg is not None else None)
        return _refused(exc.line(), inv, cfg)
    except OSError as exc:
        return _refused(f"{exc.filename or 'runtime'}: {exc.strerror}", inv, cfg)
    except Exception as exc:  # still one line for the engine, never a traceback
        return _refused(" ".join(f"internal error: {type(exc).__name__}: {exc}".split()), inv, cfg)


def _refused(message: str, inv, cfg) -> int:
    """One line to the caller (stderr, the engine's --log); a refused create or
    run also to the runtime's own log."""
    report(message, inv.log_path if inv else None, inv.log_format if inv else "text")
    if inv is not None and inv.command in ("create", "run"):
        from ..commands.refusal_log import record
        record(cfg, inv, message)
    return 1


def _print_help(inv) -> bool:
    """Ours first, then runc's help (runc's exec'd as for any passthrough)."""
    from ...version import help_lines, wants_help
    if not wants_help(inv):
        return False
    sys.stdout.write("\n".join(help_lines(config.config_path(), bool(os.environ.get("HAMI_CONFIG"))))
                     + "\n")
    sys.stdout.flush()
    return True


def _print_version(inv) -> bool:
    """Ours first, then runc's lines (tools that parse runc's read its "runc
    version" line, the last that says version)."""
    from ...version import line, wants_version
    if not wants_version(inv):
        return False
    sys.stdout.write(line() + "\n")
    sys.stdout.flush()
    return True
