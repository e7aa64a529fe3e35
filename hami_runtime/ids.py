"""Container ids: checked before any of them becomes part of a path."""
from __future__ import annotations

from .errors import HamiError
from .names import container_id


def check_container_id(value) -> str:
    if not isinstance(value, str) or not value:
        raise HamiError("container id", "", "missing: the command's last argument names the "
                        "container (one that starts with '-' is taken for a flag)")
    if not container_id(value) or ".." in value:
        raise HamiError("container id", value, "must be letters, digits, '_', '.', '+', '-', "
                        "starting with a letter or digit (no path parts)")
    return value
