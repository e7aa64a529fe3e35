"""The one style of every `hamictl ... --json`: two-space indent, keys sorted,
one document per run, ending in a newline (click.echo adds it)."""
from __future__ import annotations

import json


def dumps(value) -> str:
    return json.dumps(value, indent=2, sort_keys=True)
