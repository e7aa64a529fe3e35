"""The runtime's own log (config log_file / log_level); never fails the caller.
A message is one line: what a container's spec put in it (an annotation key, an
env entry) cannot start a line of its own, drive a terminal, or fail the write."""
from __future__ import annotations

import os
import time

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
MAX_MESSAGE = 4096  # characters, before escaping


def one_line(message: str) -> str:
    """Cut at MAX_MESSAGE ('...' marks the cut); each character that is not
    printable (a newline, ESC, NUL, a lone surrogate) written as its backslash
    escape."""
    if len(message) > MAX_MESSAGE:
        message = message[:MAX_MESSAGE] + "..."
    if message.isprintable():
        return message
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in message)


def write(cfg, level: str, message: str) -> None:
    if not cfg.log_file or LEVELS[level] < LEVELS[cfg.log_level]:
        return
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        with open(cfg.log_file, "a", encoding="utf-8") as log:
            log.write(f"{stamp} {level} pid={os.getpid()} {one_line(message)}\n")
    except OSError:
        pass
