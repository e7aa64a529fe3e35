"""hami-runtime: runc's command line; create/run allocate and edit the spec,
delete releases, everything else becomes runc at once.

The import path stays light (no pydantic, pynvml, jsonschema) until a
create or run needs them.
"""
from __future__ import annotations

import os
import sys

from . import argv as argv_mod
from . import config
from .errors import HamiError, report

LAUNCHER_ENV = "HAMI_LAUNCHER"  # hami_runtime/launcher/hook.h
WARM_UP_ENV = "HAMI_WARM_UP"    # the same


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Set by the C launcher for create/run; not passed on to runc.
    launcher = os.environ.pop(LAUNCHER_ENV, None)
    if os.environ.pop(WARM_UP_ENV, None) == "1":  # the launcher's, detached: caches only
        from .lifecycle.warm_up import warm_up
        return warm_up()
    inv = cfg = None
    try:
        inv = argv_mod.parse(argv)
        # runc prints its version for --version and runs no subcommand
        shown = ("version" in inv.global_flags or "v" in inv.global_flags) and _print_version(inv)
        cfg = config.load()
        runtime = config.real_runtime(cfg)
        if shown:
            pass
        elif inv.command in ("create", "run"):
            from .lifecycle.create import prepare
            prepare(cfg, inv, launcher)
        elif inv.command == "delete":
            from .lifecycle.delete import delete
            return delete(cfg, inv, runtime)
        os.execv(runtime, [runtime] + argv)
    except HamiError as exc:
        if exc.field.startswith("config ") or exc.field == "NVML":
            from .config_origin import explain
            exc = explain(exc, cfg.path if cfg is not None else None)
        return _refused(exc.line(), inv, cfg)
    except OSError as exc:
        return _refused(f"{exc.filename or 'runtime'}: {exc.strerror}", inv, cfg)
    except Exception as exc:  # still one line for the engine, never a traceback
        return _refused(" ".join(f"internal error: {type(exc).__name__}: {exc}".split()), inv, cfg)
    return 1  # not reached: execv replaced us


def _refused(message: str, inv, cfg) -> int:
    """One line to the caller (stderr, the engine's --log); a refused create or
    run also to the runtime's own log."""
    report(message, inv.log_path if inv else None, inv.log_format if inv else "text")
    if inv is not None and inv.command in ("create", "run"):
        from .lifecycle.refusal_log import record
        record(cfg, inv, message)
    return 1


def _print_version(inv) -> bool:
    """Ours first, then runc's lines (tools that parse runc's read its "runc
    version" line, the last that says version)."""
    from .version import line, wants_version
    if not wants_version(inv):
        return False
    sys.stdout.write(line() + "\n")
    sys.stdout.flush()
    return True


if __name__ == "__main__":
    sys.exit(main())
