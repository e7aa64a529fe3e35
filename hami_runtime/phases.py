"""One create's phases, timed on the monotonic clock, so that a node can say
where a GPU create spends its time: at log level debug, one line per create,

    create <id> phases: launcher=0.9ms handoff=0.6ms config=0.3ms ... total=9.8ms; <notes>

each phase the time since the one before it (the first since the launcher
started, where the launcher says when: LAUNCHER_STARTED_ENV, a CLOCK_MONOTONIC
stamp in ns, the clock time.monotonic_ns reads). What follows the line (the
launcher's exec of runc, runc's create and the createRuntime hook) is not in
it: a bench has it as the command's wall time less the total. The notes say
what a phase did that its time depends on (the create server or a Python of
its own; discovery from its cache or through NVML).

Recording is a clock read and a list append per phase, always on; only the
line is written at debug, so the trace costs nothing worth naming when off.
"""
from __future__ import annotations

import os
import time

LAUNCHER_STARTED_ENV = "HAMI_LAUNCHER_STARTED_NS"  # hami_runtime/launcher/hook.h
PREFIX = "phases: "


class Trace:
    def __init__(self, start_ns: int):
        self.last = start_ns
        self.spans: list[tuple[str, int]] = []
        self.notes: list[str] = []

    def mark(self, name: str, now_ns: int | None = None) -> None:
        """Ends phase `name`: the time since the previous mark (or the start)."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        self.spans.append((name, max(0, now - self.last)))
        self.last = now

    def line(self, cid: str) -> str:
        spans = " ".join(f"{name}={ns / 1e6:.2f}ms" for name, ns in self.spans)
        total = sum(ns for _, ns in self.spans) / 1e6
        notes = "".join(f"; {n}" for n in self.notes)
        return f"create {cid} {PREFIX}{spans} total={total:.2f}ms{notes}"


current: Trace | None = None


def launcher_started(environ=os.environ) -> int | None:
    """The launcher's stamp, taken out of the environment (never passed on);
    None where there is none or it is not a time of this boot's past."""
    text = environ.pop(LAUNCHER_STARTED_ENV, None)
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    try:
        stamp = int(text)
    except (TypeError, ValueError):
        return None
    return stamp if 0 < stamp <= time.monotonic_ns() else None


def begin(start_ns: int | None = None) -> Trace:
    """A new trace for this process's create, from `start_ns` (now if None)."""
    global current
    current = Trace(time.monotonic_ns() if start_ns is None else start_ns)
    return current


def mark(name: str) -> None:
    if current is not None:
        current.mark(name)


def note(text: str) -> None:
    if current is not None:
        current.notes.append(text)


def since_ms(start_ns: int) -> float:
    return (time.monotonic_ns() - start_ns) / 1e6


def write(cfg, cid: str) -> None:
    """The create's line in the runtime's log, at debug only."""
    if current is not None and cfg is not None and cfg.log_level == "debug":
        from . import log
        log.write(cfg, "debug", current.line(cid))
