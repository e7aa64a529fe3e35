"""The node config (TOML): defaults, validation, lookup of the real runtime.

Kept free of heavy imports: a create with no request reads it too, so the
classes here are written out rather than made by dataclasses (which loads
inspect, a good part of such a create's time).
"""
from __future__ import annotations

import os
import sys
import time
from typing import NamedTuple

from . import config_cache, installed
from .errors import HamiError
from .names import env_name

DEFAULT_PATH = "/etc/hami/config.toml"
CORE_POLICIES = ("default", "force", "disable")  # GPU_CORE_UTILIZATION_POLICY values
DEFAULT_RUNTIMES = ["/usr/bin/runc", "/usr/sbin/runc", "/usr/local/bin/runc", "/usr/local/sbin/runc"]


class ExtraMount(NamedTuple):
    source: str
    destination: str
    readonly: bool = False


# name -> a fresh default (lists and dicts are never shared between configs)
DEFAULTS = {
    "runtime": lambda: list(DEFAULT_RUNTIMES),
    "state_dir": lambda: config_cache.DEFAULT_STATE_DIR,
    "libvgpu": lambda: installed.LIBVGPU,  # <prefix>/lib/hami/libvgpu.so of this install
    "split_count": lambda: 10,
    "memory_scaling": lambda: 1.0,
    "default_memory_mib": lambda: 0,   # 0: the whole card (after scaling)
    "default_cores": lambda: 0,        # 0: no SM limit
    "core_policy": lambda: "default",  # when the request names none (hami.io/core-policy)
    "priority_idle_ms": lambda: 200,   # high-priority work idle this long: low-priority resumes
    "policy": lambda: "binpack",
    "driver_root": lambda: "/",
    "dev_root": lambda: "/dev",
    "proc_devices": lambda: "/proc/devices",
    "nvml_library": lambda: "",        # "": the loader's libnvidia-ml.so.1
    "env_requests": lambda: True,
    "log_file": lambda: "",
    "log_level": lambda: "info",
    "extra_env": dict,
    "extra_mounts": list,              # of ExtraMount
    "hook_command": list,              # []: this Python, -m hami_hook
    "path": lambda: "",                # where it was read from
}


class Config:
    """The validated config; read-only. Config(**values), the rest defaults."""
    __slots__ = tuple(DEFAULTS)

    def __init__(self, **values):
        unknown = set(values) - set(DEFAULTS)
        if unknown:
            raise TypeError(f"Config: unknown field {sorted(unknown)[0]!r}")
        for name, default in DEFAULTS.items():
            object.__setattr__(self, name, values[name] if name in values else default())

    def __setattr__(self, name, value):
        raise AttributeError(f"Config is read-only: cannot set {name!r}")

    def __delattr__(self, name):
        raise AttributeError(f"Config is read-only: cannot delete {name!r}")

    def __eq__(self, other):
        if type(other) is not Config:
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in DEFAULTS)

    __hash__ = None  # holds lists, as before

    def __repr__(self):
        return "Config(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in DEFAULTS) + ")"


def _abs_path(key, value, allow_empty=False):
    if not isinstance(value, str):
        raise HamiError(f"config {key}", value, "must be a string path")
    if value == "" and allow_empty:
        return value
    if not os.path.isabs(value):
        raise HamiError(f"config {key}", value, "must be an absolute path")
    return os.path.normpath(value)


def _int(key, value, low, high):
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise HamiError(f"config {key}", value, f"must be a whole number from {low} to {high}")
    return value


def _choice(key, value, choices):
    if value not in choices:
        raise HamiError(f"config {key}", value, "must be one of " + ", ".join(choices))
    return value


def _runtime(key, value):
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise HamiError(f"config {key}", value, "must be a path or a non-empty list of paths")
    return [_abs_path(key, item) for item in items]


def _scaling(key, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 100:
        raise HamiError(f"config {key}", value, "must be a number above 0 and at most 100")
    return float(value)


def _bool(key, value):
    if not isinstance(value, bool):
        raise HamiError(f"config {key}", value, "must be true or false")
    return value


def _env(key, value):
    if not isinstance(value, dict):
        raise HamiError(f"config {key}", value, "must be a table of NAME = \"value\"")
    for name, item in value.items():
        if not env_name(name) or not isinstance(item, str):
            raise HamiError(f"config {key}.{name}", item, "must be NAME = \"string\"")
    return dict(value)


def _mounts(key, value):
    if not isinstance(value, list):
        raise HamiError(f"config {key}", value, "must be a list of tables")
    mounts = []
    for n, item in enumerate(value):
        where = f"{key}[{n}]"
        if not isinstance(item, dict):
            raise HamiError(f"config {where}", item, "must be a table with source and destination")
        unknown = set(item) - {"source", "destination", "readonly"}
        if unknown:
            name = sorted(unknown)[0]
            raise HamiError(f"config {where}.{name}", item[name], "unknown key")
        if "source" not in item or "destination" not in item:
            raise HamiError(f"config {where}", item, "needs source and destination")
        mounts.append(ExtraMount(_abs_path(f"{where}.source", item["source"]),
                                 _abs_path(f"{where}.destination", item["destination"]),
                                 _bool(f"{where}.readonly", item.get("readonly", False))))
    return mounts


def _command(key, value):
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise HamiError(f"config {key}", value, "must be a non-empty list of strings")
    _abs_path(key, value[0])
    return list(value)


VALIDATORS = {
    "runtime": _runtime,
    "state_dir": _abs_path,
    "libvgpu": _abs_path,
    "split_count": lambda k, v: _int(k, v, 1, 1024),
    "memory_scaling": _scaling,
    "default_memory_mib": lambda k, v: _int(k, v, 0, 1 << 30),
    "default_cores": lambda k, v: _int(k, v, 0, 100),
    "core_policy": lambda k, v: _choice(k, v, CORE_POLICIES),
    "priority_idle_ms": lambda k, v: _int(k, v, 1, 60000),
    "policy": lambda k, v: _choice(k, v, ("binpack", "spread")),
    "driver_root": _abs_path,
    "dev_root": _abs_path,
    "proc_devices": _abs_path,
    "nvml_library": lambda k, v: _abs_path(k, v, allow_empty=True),
    "env_requests": _bool,
    "log_file": lambda k, v: _abs_path(k, v, allow_empty=True),
    "log_level": lambda k, v: _choice(k, v, ("debug", "info", "warning", "error")),
    "extra_env": _env,
    "extra_mounts": _mounts,
    "hook_command": _command,
}
assert set(VALIDATORS) == set(DEFAULTS) - {"path"}


def from_mapping(raw: dict, path: str = "") -> Config:
    values = {}
    for key, value in raw.items():
        if key not in VALIDATORS:
            raise HamiError(f"config {key}", value, f"unknown key in {path or 'config'}")
        values[key] = VALIDATORS[key](key, value)
    return Config(path=path, **values)


def config_path() -> str:
    return os.environ.get("HAMI_CONFIG") or DEFAULT_PATH


def load(path: str | None = None) -> Config:
    """Read the config; a missing default file means the defaults, a missing
    HAMI_CONFIG file is an error (the operator named it). The parsed document
    comes from config_cache while the file is the one it was parsed from."""
    path = path or config_path()
    try:
        with open(path, "rb") as handle:
            before = os.fstat(handle.fileno())
            text = handle.read()
            after = os.fstat(handle.fileno())
    except FileNotFoundError:
        if path == DEFAULT_PATH and "HAMI_CONFIG" not in os.environ:
            return Config(path="")
        raise HamiError("HAMI_CONFIG", path, "config file not found") from None
    except OSError as exc:
        raise HamiError("HAMI_CONFIG", path, f"cannot read config file: {exc.strerror}") from None
    key = config_cache.file_key(path, before)
    # unchanged while read, and not written in the last seconds (a rewrite in
    # the same clock tick would keep every time in the key)
    steady = key == config_cache.file_key(path, after) and \
        time.time_ns() - after.st_ctime_ns > config_cache.SETTLED_NS
    hint = config_cache.state_dir_hint(text) if steady else ""
    document = config_cache.lookup(hint, key)
    if document is not None:
        cfg = from_mapping(document, path)
        if cfg.state_dir == hint:
            return cfg
    if sys.version_info >= (3, 11):
        import tomllib  # here: with typing, datetime and string, a good part of a create's start
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        raw = tomllib.loads(text.decode())  # as tomllib.load does
    except tomllib.TOMLDecodeError as exc:
        raise HamiError("HAMI_CONFIG", path, f"not valid TOML: {exc}") from None
    cfg = from_mapping(raw, path)
    if hint and cfg.state_dir == hint:
        config_cache.store(hint, key, raw)
    return cfg


def real_runtime(cfg: Config) -> str:
    """The first runtime candidate that exists, is executable and is not us."""
    me = os.path.realpath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    for candidate in cfg.runtime:
        if not (os.path.isfile(candidate) and os.access(candidate, os.X_OK)):
            continue
        real = os.path.realpath(candidate)
        if real == me or os.path.basename(real).startswith("hami-runtime"):
            raise HamiError("config runtime", candidate, "points at hami-runtime itself")
        return candidate
    raise HamiError("config runtime", ",".join(cfg.runtime), "no executable OCI runtime found")
