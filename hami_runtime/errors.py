"""Refusals: one line that names the field and the value, written as runc does."""
from __future__ import annotations

import json
import sys
import time


class HamiError(Exception):
    """A refusal: `field` is the key, annotation, flag or file at fault."""

    def __init__(self, field: str, value, reason: str):
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(self.line())

    def line(self) -> str:
        value = self.value if isinstance(self.value, str) else repr(self.value)
        if len(value) > 200:
            value = value[:200] + "..."
        # repr: a newline or other control character in the value (or in a field
        # that is the tenant's annotation key) stays on this one line, escaped
        field = self.field if self.field.isprintable() else ascii(self.field)[1:-1]
        return f"{field}={value!r}: {self.reason}" if value != "" else f"{field}: {self.reason}"


def _rfc3339() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e9):09d}Z"


def log_line(message: str, level: str = "error", log_format: str = "text") -> str:
    """A line in runc's own log formats (json, or logrus text)."""
    stamp = _rfc3339()
    if log_format == "json":
        return json.dumps({"level": level, "msg": message, "time": stamp}) + "\n"
    return f'time="{stamp}" level={level} msg={json.dumps(message)}\n'


def report(message: str, log_path: str | None, log_format: str | None) -> None:
    """Tell the caller: stderr always, the engine's --log file when it gave one."""
    sys.stderr.write(f"hami-runtime: {message}\n")
    sys.stderr.flush()
    if log_path:
        try:
            with open(log_path, "a", encoding="utf-8") as log:
                log.write(log_line(message, "error", log_format or "text"))
        except OSError:
            pass
