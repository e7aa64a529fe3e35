"""Reading and writing a bundle's config.json (the OCI runtime spec)."""
from __future__ import annotations

import json
import os
import stat

from ...errors import HamiError
from ...files import atomic_write


def spec_path(bundle: str) -> str:
    return os.path.join(bundle, "config.json")


def load(bundle: str) -> dict:
    path = spec_path(bundle)
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        raise HamiError("bundle", bundle, f"cannot read config.json: {exc.strerror}") from None
    try:
        # bytes that are not UTF-8 read as U+FFFD, as runc (Go's encoding/json) reads them
        spec = json.loads(raw.decode("utf-8", "replace"))
    except ValueError as exc:
        raise HamiError(path, raw[:60].decode("utf-8", "replace"), f"not valid JSON: {exc}") from None
    if not isinstance(spec, dict):
        raise HamiError(path, type(spec).__name__, "the spec must be a JSON object")
    annotations = spec.get("annotations", {})
    if annotations is not None and (not isinstance(annotations, dict) or not all(
            isinstance(v, str) for v in annotations.values())):
        raise HamiError(f"{path} annotations", json.dumps(annotations)[:80],
                        "must map names to strings")
    process = spec.get("process", {})
    if process is not None and not isinstance(process, dict):
        raise HamiError(f"{path} process", json.dumps(process)[:80], "must be an object")
    env = (process or {}).get("env", [])
    if env is not None and (not isinstance(env, list) or not all(isinstance(e, str) for e in env)):
        raise HamiError(f"{path} process.env", json.dumps(env)[:80], "must be a list of strings")
    for key in ("linux", "hooks"):
        if spec.get(key) is not None and not isinstance(spec[key], dict):
            raise HamiError(f"{path} {key}", json.dumps(spec[key])[:80], "must be an object")
    if spec.get("mounts") is not None and not isinstance(spec["mounts"], list):
        raise HamiError(f"{path} mounts", json.dumps(spec["mounts"])[:80], "must be a list")
    return spec


def write(bundle: str, spec: dict) -> None:
    path = spec_path(bundle)
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mode = 0o644
    # compact: json's C encoder writes it; an indent takes its Python one (~5x slower)
    atomic_write(path, json.dumps(spec).encode() + b"\n", mode)
