"""Container ids: checked before any of them becomes part of a path."""
from __future__ import annotations

import re

from .errors import HamiError

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,1023}")


def check_container_id(value) -> str:
    if not isinstance(value, str) or not value:
        raise HamiError("container id", value if isinstance(value, str) else repr(value),
                        "missing container id")
    if not _ID.fullmatch(value) or ".." in value:  # fullmatch: "$" would let "id\n" through
        raise HamiError("container id", value,
                        "must be letters, digits, '_', '.', '+', '-' (no path parts)")
    return value
