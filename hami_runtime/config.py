"""The node config (TOML): the validated values and where they come from, and
the lookup of the real runtime.

The keys, their types, bounds and defaults are config_model.NodeConfig's. A file
is validated through that model when it is not the one validated before; its
values are then kept in the state dir's cache (config_cache.py), bound to the
file's identity and bytes and the model's by the node's cache key, so a create
with an unchanged config reads neither TOML nor the model. A copy is kept in
/var/cache/hami too: the state dir is a tmpfs emptied at boot while the config
file stays, and the first create after a boot need not validate it again. A
cache entry that cannot be trusted is refused with a line in the runtime's log.
"""
from __future__ import annotations

import json
import os
import sys
import time

from . import config_cache
from .errors import HamiError

DEFAULT_PATH = "/etc/hami/config.toml"  # make install writes its SYSCONFDIR's here
MODEL_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config_model.py")


class Config:
    """The validated config, read-only: every NodeConfig key as an attribute,
    and `path`, the file it was read from ("" for the defaults).
    Config(**values) validates the values through the model."""
    __slots__ = ("_values",)

    def __init__(self, path: str = "", **values):
        from .config_model import validate
        object.__setattr__(self, "_values", {**validate(values, path or "Config()"), "path": path})

    @classmethod
    def from_values(cls, values: dict) -> Config:
        """The config of values the model has validated already (the cache's)."""
        cfg = cls.__new__(cls)
        object.__setattr__(cfg, "_values", values)
        return cfg

    def __getattr__(self, name):
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"Config has no key {name!r}") from None

    def __setattr__(self, name, value):
        raise AttributeError(f"Config is read-only: cannot set {name!r}")

    def __eq__(self, other):
        if type(other) is not Config:
            return NotImplemented
        return {k: v for k, v in self._values.items() if k != "path"} == \
            {k: v for k, v in other._values.items() if k != "path"}

    __hash__ = None  # holds lists

    def __repr__(self):
        return "Config(" + ", ".join(f"{k}={v!r}" for k, v in self._values.items()) + ")"


def config_path() -> str:
    return os.environ.get("HAMI_CONFIG") or DEFAULT_PATH


def _file_field() -> str:
    """What a refusal of the config file names: the variable where it chose the file."""
    return "HAMI_CONFIG" if os.environ.get("HAMI_CONFIG") else "config file"


# The config the create server loaded, for its children: (its path, its bytes,
# the model file's key) and its values as JSON (each load gets its own copy).
_remembered: tuple | None = None


def load(path: str | None = None, keep: bool = True, remember: bool = False) -> Config:
    """Read the config; a missing default file means the defaults, a missing
    HAMI_CONFIG file is an error (the operator named it). The validated values
    come from config_cache while the file and the model are the ones they were
    validated from; they are kept there where `keep` (not for the read-only
    tools, which create nothing: config_cache.lookup). `remember` (the create
    server): this process and the children it forks take the values again
    without the cache while the file's bytes and the model are these."""
    global _remembered
    path = path or config_path()
    model_key = _model_key()
    try:
        with open(path, "rb") as handle:
            before = os.fstat(handle.fileno())
            text = handle.read()
            after = os.fstat(handle.fileno())
    except FileNotFoundError:
        if path == DEFAULT_PATH and "HAMI_CONFIG" not in os.environ:
            return _validated(b"", "", path, config_cache.DEFAULT_STATE_DIR,
                              [config_cache.NO_CONFIG_FILE, path], model_key, keep)
        raise HamiError(_file_field(), path, "config file not found") from None
    except OSError as exc:
        raise HamiError(_file_field(), path, f"cannot read config file: {exc.strerror}") from None
    same = (path, text, model_key)
    if _remembered is not None and _remembered[0] == same:
        return Config.from_values(json.loads(_remembered[1]))
    key = config_cache.file_key(path, before)
    # unchanged while read, and not written in the last seconds (a rewrite in
    # the same clock tick would keep every time in the key)
    steady = key == config_cache.file_key(path, after) and \
        time.time_ns() - after.st_ctime_ns > config_cache.SETTLED_NS
    cfg = _validated(text, path, path, config_cache.state_dir_hint(text) if steady else "", key, model_key,
                     keep)
    if remember:
        _remembered = same, json.dumps(cfg._values)
    return cfg


def _model_key():
    try:
        return config_cache.file_key(MODEL_FILE, os.stat(MODEL_FILE))
    except OSError:
        return None


def _validated(text: bytes, path: str, looked_for: str, hint: str, file_key: list, model_key,
               keep: bool = True) -> Config:
    """The values of a TOML config (b"": the defaults, none at `looked_for`),
    from the cache in `hint` (the state dir the file names) or the persistent
    one for `looked_for` where they are there (`model_key`: _model_key's)."""
    key, hint = ([file_key, model_key], hint) if model_key is not None else (None, "")
    values, refusals = config_cache.lookup(hint, key, looked_for, text, keep)
    if values is not None and values.get("state_dir") == hint:
        return _logged(Config.from_values({**values, "path": path}), refusals)
    from .config_model import validate
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        raw = tomllib.loads(text.decode())  # as tomllib.load does
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise HamiError(_file_field(), path, f"not valid TOML: {exc}") from None
    values = validate(raw, path)
    if keep and hint and values["state_dir"] == hint:
        config_cache.store(hint, key, values, looked_for, text)
    return _logged(Config.from_values({**values, "path": path}), refusals)


def _logged(cfg: Config, refusals: list) -> Config:
    """cfg, once each cache entry refused on the way to it has its line in the
    log that cfg (the trusted config, never the refused entry) names."""
    if refusals:
        from . import log
        for level, line in refusals:
            log.write(cfg, level, line)
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
