"""A host root dir as a comparable value, for the installer's checks (tests and make k8s-check)."""
import os
from pathlib import Path


def snapshot(root: Path) -> dict:
    """Every path under root: its bytes (files), its target (links), or None (dirs)."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = (os.readlink(path) if path.is_symlink() else path.read_bytes() if path.is_file() else None)
    return out
