"""The project's version, as its installed metadata says (pyproject.toml's
`version`), for `hami-runtime --version` and `hamictl --version`; the lines
`hami-runtime --help` prints before runc's help."""
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


def wants_help(inv) -> bool:
    """What makes runc print its own help and run nothing: --help / -h among
    the global flags, else (with no --version) the subcommand help or h alone,
    or no argument at all."""
    if any(inv.global_flags.get(flag, "false") not in GO_FALSE for flag in ("help", "h")):
        return True
    if wants_version(inv):
        return False
    return not inv.argv or (inv.command in ("help", "h") and not inv.positional)


def wants_command_help(inv) -> bool:
    """--help / -h after create, run or delete: runc prints that command's help
    and does nothing else."""
    return any(inv.command_flags.get(flag, "false") not in GO_FALSE for flag in ("help", "h"))


def help_lines(config_path: str, from_env: bool) -> list:
    """hami-runtime's own lines, printed before runc's help."""
    where = "HAMI_CONFIG names it" if from_env else "HAMI_CONFIG, where set, names another"
    return [
        f"{line()}: a runc-compatible OCI runtime that shares NVIDIA GPUs between containers.",
        "Its commands and flags are runc's (below): create and run give a container the GPU",
        "slice it asks for (annotations or env), delete frees it; every other command is runc's.",
        f"config: {config_path} ({where})",
        "docs: README.md and docs/ in hami-runtime's source (docs/operations.md for operators)",
        "the node's GPUs, containers and health: hamictl --help",
        "",
    ]


def line(program: str = "hami-runtime") -> str:
    return f"{program} version {version()}"
