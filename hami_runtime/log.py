"""The runtime's own log (config log_file / log_level); never fails the caller.
A message is one line: what a container's spec put in it (an annotation key, an
env entry) cannot start a line of its own, drive a terminal, or fail the write."""
from __future__ import annotations

import os
import stat
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
    line = f"{stamp} {level} pid={os.getpid()} {one_line(message)}\n".encode("utf-8", "replace")
    try:
        # never through a link, nor into a FIFO or a device, that someone planted at its name
        fd = os.open(cfg.log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_NOCTTY | os.O_CLOEXEC, 0o640)
    except OSError:
        return
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.write(fd, line)
    except OSError:
        pass
    finally:
        os.close(fd)
