"""The runtime's own log (config log_file / log_level); never fails the caller."""
from __future__ import annotations

import os
import time

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


def write(cfg, level: str, message: str) -> None:
    if not cfg.log_file or LEVELS[level] < LEVELS[cfg.log_level]:
        return
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        with open(cfg.log_file, "a", encoding="utf-8") as log:
            log.write(f"{stamp} {level} pid={os.getpid()} {message}\n")
    except OSError:
        pass
