"""The project's version, as its installed metadata says (pyproject.toml's
`version`), for `hami-runtime --version` and `hamictl --version`."""
from __future__ import annotations

DISTRIBUTION = "hami-runtime"
GO_FALSE = ("0", "f", "F", "false", "FALSE", "False")  # Go's strconv.ParseBool


def version() -> str:
    from importlib import metadata
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def wants_version(inv) -> bool:
    """runc's --version / -v among the global flags: runc prints its version
    and runs no subcommand, whatever follows."""
    return any(inv.global_flags.get(flag, "false") not in GO_FALSE for flag in ("version", "v"))


def line(program: str = "hami-runtime") -> str:
    return f"{program} version {version()}"
