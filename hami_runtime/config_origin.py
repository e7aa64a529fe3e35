"""Where a config value came from, for a refusal that names a config key: the
file that sets it, or the default, and which file was read (or that none was).

Used only on the refusal path: it reads the config file again, as written.
"""
from __future__ import annotations

import re
import sys

from . import config
from .errors import HamiError

PREFIX = "config "


def origin(key: str, path: str) -> str:
    """key: a top-level config key; path: the file the config was read from
    ("" where none was: the defaults)."""
    if not path:
        return f"the default: no config file at {config.DEFAULT_PATH}, and HAMI_CONFIG is unset"
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        with open(path, "rb") as handle:
            raw = tomllib.load(handle)
    except (OSError, ValueError):
        return f"from {path}"
    return f"set in {path}" if key in raw else f"the default: {path} does not set {key}"


# fields that name no config key but whose value is one's
KEY_OF_FIELD = {"NVML": "nvml_library"}


def explain(exc: HamiError, path: str | None) -> HamiError:
    """The refusal with where its config value came from; unchanged for a
    field that is no config key, where the config was not read (the error
    reading it names the file), or where the line says already."""
    if path is None or "(in " in exc.reason:
        return exc
    if exc.field.startswith(PREFIX):
        key = re.split(r"[.\[]", exc.field[len(PREFIX):], maxsplit=1)[0]
        return HamiError(exc.field, exc.value, f"{exc.reason} ({origin(key, path)})")
    if exc.field in KEY_OF_FIELD:
        key = KEY_OF_FIELD[exc.field]
        return HamiError(exc.field, exc.value, f"{exc.reason} (config {key}: {origin(key, path)})")
    return exc
