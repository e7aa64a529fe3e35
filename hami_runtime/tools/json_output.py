"""The one style of every `hamictl ... --json`: two-space indent, keys sorted,
one document per run, ending in a newline (click.echo adds it). Every string is
valid UTF-8 (display_text.valid_utf8), so a tenant's lone surrogate never
reaches a parser as one."""
from __future__ import annotations

import json

from .display_text import valid_utf8


def dumps(value) -> str:
    return json.dumps(_valid(value), indent=2, sort_keys=True)


def _valid(value):
    if isinstance(value, str):
        return valid_utf8(value)
    if isinstance(value, dict):
        return {_valid(k): _valid(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_valid(v) for v in value]
    return value
