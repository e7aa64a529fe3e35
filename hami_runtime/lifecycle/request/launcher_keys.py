"""What the C launcher looks for in a spec before it runs runc itself (its fast
path for a container that asks for no GPU, hami_runtime/launcher/spec_scan.c).

`make build` writes these into the header the launcher is compiled with
(`python -m hami_runtime.lifecycle.request.launcher_keys FILE`), so the C side cannot
drift from the request parser. Each list is a superset of what the Python
side reads, compared without regard to case:

- an annotation key that contains any of ANNOTATION_MARKS (every request key
  and alias, a pod container's `<name>.hami.io/<key>`, CDI device annotations);
- an env entry whose name starts with any of ENV_PREFIXES (NVIDIA_VISIBLE_DEVICES,
  HAMI_GPUMEM and the others, and every other NVIDIA_* variable);
- any string under `hooks` that contains one of HOOK_NAMES (dockerd's --gpus hook).

A spec with any of them, or anything the launcher does not read exactly as
Python's json does, goes to the Python runtime, which decides as always.
"""
from __future__ import annotations

import sys

from .docker_gpus import HOOK_NAMES
from .request_keys import CDI_ANNOTATION_PREFIX, CONTAINER_DOMAIN, ENV_KEYS, PREFIXES, VISIBLE

ANNOTATION_MARKS = tuple(dict.fromkeys(
    PREFIXES + (CONTAINER_DOMAIN.lstrip(".") + "/", CDI_ANNOTATION_PREFIX)))
ENV_PREFIXES = tuple(dict.fromkeys(name.partition("_")[0] + "_" for name in (VISIBLE,) + ENV_KEYS))


def _c_list(name: str, items) -> str:
    for item in items:
        if not item.isascii() or not item.isprintable() or '"' in item or "\\" in item:
            raise ValueError(f"{name}: {item!r} cannot be written as a plain C string")
    return f"#define {name} " + ", ".join(f'"{item}"' for item in items) + "\n"


def c_header() -> str:
    return ("/* Written by make build from hami_runtime/lifecycle/request/launcher_keys.py: do not edit. */\n"
            + _c_list("SPEC_ANNOTATION_MARKS", ANNOTATION_MARKS)
            + _c_list("SPEC_ENV_PREFIXES", ENV_PREFIXES)
            + _c_list("SPEC_HOOK_NAMES", HOOK_NAMES))


def _folded(text: str) -> bytes:
    """The UTF-8 bytes with ASCII letters in lower case, as the C side compares."""
    return text.encode("utf-8", "surrogatepass").lower()


def covers_annotation(key: str) -> bool:
    """The launcher's rule for an annotation key (spec_scan.c)."""
    return any(_folded(mark) in _folded(key) for mark in ANNOTATION_MARKS)


def covers_env(entry: str) -> bool:
    """The launcher's rule for an env entry: its name, up to the first '='."""
    name = _folded(entry.partition("=")[0])
    return any(name.startswith(_folded(prefix)) for prefix in ENV_PREFIXES)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = c_header()
    if argv:
        with open(argv[0], "w", encoding="ascii") as handle:
            handle.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
