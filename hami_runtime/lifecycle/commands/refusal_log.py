"""A refused create or run in the runtime's own log (config log_file), at
warning: the container id, the pod's names where the spec has them, and the
same one line the engine gets. Runs only on the refusal path.

Where the config itself was refused, its log_file and log_level are taken from
the file as written, where they are usable, so that a node whose config went
bad still says so in its log.
"""
from __future__ import annotations

import os
import sys
from types import SimpleNamespace

from ... import config, log

LEVEL = "warning"


def record(cfg, inv, message: str) -> None:
    """Never raises: the refusal itself is what the caller reports."""
    try:
        cfg = cfg if cfg is not None else _log_settings()
        if cfg is not None:
            log.write(cfg, LEVEL, f"{who(inv)}: refused: {message}")
    except Exception:  # the engine still gets the refusal
        pass


def who(inv) -> str:
    """'<id>', or '<id> (container <name> of pod <namespace>/<pod>)'."""
    cid = inv.container_id or "(no container id)"
    try:
        from ..request import pod_identity
        from ..spec_edit import spec
        member = pod_identity.member(spec.load(inv.bundle).get("annotations") or {})
    except Exception:  # an unreadable spec or pod annotations: the id alone
        return cid
    return f"{cid} ({member.describe()})" if member is not None else cid


def _log_settings():
    """log_file and log_level as the config file writes them, or None."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        with open(config.config_path(), "rb") as handle:
            raw = tomllib.load(handle)
    except (OSError, ValueError):
        return None
    log_file, level = raw.get("log_file"), raw.get("log_level", "info")
    if not isinstance(log_file, str) or not os.path.isabs(log_file) or level not in log.LEVELS:
        return None
    return SimpleNamespace(log_file=log_file, log_level=level)
