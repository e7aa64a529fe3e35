"""runc's command line, parsed by hand so that passthrough stays cheap.

Go's flag package (which runc's CLI library uses) takes `-flag`, `--flag`,
`--flag value` and `--flag=value` alike; so do we.
"""
from __future__ import annotations

import os

from .errors import HamiError

GLOBAL_VALUE_FLAGS = {"log", "log-format", "root", "criu", "rootless"}
GLOBAL_BOOL_FLAGS = {"debug", "systemd-cgroup", "help", "h", "version", "v"}

# Flags of the subcommands we act on; all others pass through untouched.
COMMAND_VALUE_FLAGS = {
    "create": {"bundle", "b", "console-socket", "pid-file", "preserve-fds", "pidfd-socket"},
    "run": {"bundle", "b", "console-socket", "pid-file", "preserve-fds", "pidfd-socket"},
    "delete": set(),
}
MODIFIED_COMMANDS = set(COMMAND_VALUE_FLAGS)
DEFAULT_ROOT = "/run/runc"


class Invocation:
    """One command line, parsed (a plain class: dataclasses would load inspect)."""

    def __init__(self, argv: list[str], global_flags: dict[str, str] | None = None,
                 command: str | None = None, command_flags: dict[str, str] | None = None,
                 positional: list[str] | None = None):
        self.argv = argv                                  # everything after the program name
        self.global_flags = {} if global_flags is None else global_flags
        self.command = command
        self.command_flags = {} if command_flags is None else command_flags
        self.positional = [] if positional is None else positional

    def _values(self):
        return (self.argv, self.global_flags, self.command, self.command_flags, self.positional)

    def __eq__(self, other):
        return self._values() == other._values() if type(other) is Invocation else NotImplemented

    __hash__ = None

    def __repr__(self):
        return ("Invocation(argv={!r}, global_flags={!r}, command={!r}, command_flags={!r}, "
                "positional={!r})".format(*self._values()))

    @property
    def root(self) -> str:
        return os.path.abspath(self.global_flags.get("root") or DEFAULT_ROOT)

    @property
    def log_path(self) -> str | None:
        return self.global_flags.get("log") or None

    @property
    def log_format(self) -> str:
        return self.global_flags.get("log-format") or "text"

    @property
    def container_id(self) -> str | None:
        return self.positional[0] if self.positional else None

    @property
    def bundle(self) -> str:
        value = self.command_flags.get("bundle") or self.command_flags.get("b") or ""
        return os.path.abspath(value or os.getcwd())


def _split_flag(arg: str):
    """'--a=b' -> ('a', 'b'); '-a' -> ('a', None); not a flag -> (None, None)."""
    if arg in ("-", "--") or not arg.startswith("-"):
        return None, None
    body = arg.lstrip("-")
    if arg.startswith("---"):
        return None, None
    name, eq, value = body.partition("=")
    return name, (value if eq else None)


def _flag_value(argv: list[str], i: int, name: str, value: str | None):
    """The value of the value-taking flag at argv[i], inline ('--a=b') or the
    next argument; returns it with the index of the last argument it used."""
    if value is not None:
        return value, i
    if i + 1 >= len(argv):
        raise HamiError(f"--{name}", "", "flag needs a value")
    return argv[i + 1], i + 1


def parse(argv: list[str]) -> Invocation:
    """Parse runc's argv (without the program name). Only the global flags and
    the flags of create/run/delete are understood; the rest is kept verbatim."""
    inv = Invocation(argv=list(argv))
    i = 0
    while i < len(argv):
        name, value = _split_flag(argv[i])
        if name is None:
            break
        if name in GLOBAL_VALUE_FLAGS:
            inv.global_flags[name], i = _flag_value(argv, i, name, value)
        elif name in GLOBAL_BOOL_FLAGS:
            inv.global_flags[name] = "true" if value is None else value
        else:
            # An unknown global flag: leave everything to runc.
            return inv
        i += 1
    if i >= len(argv):
        return inv
    inv.command = argv[i]
    if inv.command not in MODIFIED_COMMANDS:
        inv.positional = argv[i + 1:]
        return inv
    value_flags = COMMAND_VALUE_FLAGS[inv.command]
    i += 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            inv.positional.extend(argv[i + 1:])
            break
        name, value = _split_flag(arg)
        if name is None:
            inv.positional.append(arg)
        elif name in value_flags:
            inv.command_flags[name], i = _flag_value(argv, i, name, value)
        else:
            inv.command_flags[name] = "true" if value is None else value
        i += 1
    return inv
