"""Container ids: checked before any of them becomes part of a path."""
from __future__ import annotations

from .errors import HamiError
from .names import container_id


def check_container_id(value) -> str:
    if not isinstance(value, str) or not value:
        raise HamiError("container id", value if isinstance(value, str) else repr(value),
                        "missing container id")
    if not container_id(value) or ".." in value:
        raise HamiError("container id", value,
                        "must be letters, digits, '_', '.', '+', '-' (no path parts)")
    return value
