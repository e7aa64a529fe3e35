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


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Set by the C launcher for create/run; not passed on to runc.
    launcher = os.environ.pop(LAUNCHER_ENV, None)
    inv = None
    try:
        inv = argv_mod.parse(argv)
        cfg = config.load()
        runtime = config.real_runtime(cfg)
        if inv.command in ("create", "run"):
            from .lifecycle.create import prepare
            prepare(cfg, inv, launcher)
        elif inv.command == "delete":
            from .lifecycle.delete import delete
            return delete(cfg, inv, runtime)
        os.execv(runtime, [runtime] + argv)
    except HamiError as exc:
        report(exc.line(), inv.log_path if inv else None, inv.log_format if inv else "text")
        return 1
    except OSError as exc:
        report(f"{exc.filename or 'runtime'}: {exc.strerror}", inv.log_path if inv else None,
               inv.log_format if inv else "text")
        return 1
    except Exception as exc:  # still one line for the engine, never a traceback
        message = " ".join(f"internal error: {type(exc).__name__}: {exc}".split())
        report(message, inv.log_path if inv else None, inv.log_format if inv else "text")
        return 1
    return 1  # not reached: execv replaced us


if __name__ == "__main__":
    sys.exit(main())
