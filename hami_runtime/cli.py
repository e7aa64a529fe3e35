"""hami-runtime: runc's command line (lifecycle/serving/command.py), or what the launcher
starts detached: the warm-up of the caches, the create server.
"""
from __future__ import annotations

import os
import sys

from .lifecycle.serving.command import run

WARM_UP_ENV = "HAMI_WARM_UP"          # hami_runtime/launcher/hook.h
SERVER_ENV = "HAMI_CREATE_SERVER"     # the same


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if os.environ.pop(WARM_UP_ENV, None) == "1":  # the launcher's, detached: caches only
        from .lifecycle.serving.warm_up import warm_up
        return warm_up()
    if os.environ.pop(SERVER_ENV, None) == "1":  # the launcher's, detached
        from .lifecycle.serving.create_server import serve
        return serve()
    return run(argv, os.getpid(), os.execv)


if __name__ == "__main__":
    sys.exit(main())
