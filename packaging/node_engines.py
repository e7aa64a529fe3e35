"""The engine config edits that register the "hami" runtime handler: pure
functions from the files' bytes to the files' new bytes (node_installer.py
reads and writes them on the host).

containerd (version = 2 configs: containerd 1.5 to 1.7): a drop-in,
/etc/containerd/conf.d/hami.toml, that the main config's `imports` reads. An
import replaces the main config's whole section of a plugin (containerd 1.x
merges imports per plugin, not per key), so the drop-in carries the main
config's CRI section, line for line, with the hami handler added: the node's
other CRI settings stay as they were. The main config gets the conf.d import
only where none of its imports reads the drop-in already; the edit (the
imports line as it was and as it is now) is returned so that uninstall puts
the file back byte for byte.

CRI-O: a drop-in, /etc/crio/crio.conf.d/10-hami.conf (CRI-O merges its
drop-ins key by key).
"""
from __future__ import annotations

import fnmatch
import json
import os
import re
import tomllib

HANDLER = "hami"
CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CONTAINERD_DROPIN = "/etc/containerd/conf.d/hami.toml"
CONTAINERD_IMPORT = "/etc/containerd/conf.d/*.toml"
CRIO_DROPIN = "/etc/crio/crio.conf.d/10-hami.conf"
CRI = "io.containerd.grpc.v1.cri"
CRI_HEADER = f'plugins."{CRI}"'
# what the handler passes to the runtime (examples/containerd/hami.toml)
POD_ANNOTATIONS = ["hami.io/*", "nvidia.com/*", "*.hami.io/*"]
CONTAINER_ANNOTATIONS = ["cdi.k8s.io/*"]
HEADER = re.compile(r"^[ \t]*\[(\[?)([^\[\]\n]+)\]\]?[ \t]*(#[^\n]*)?$", re.M)
IMPORTS = re.compile(r"^imports[ \t]*=[ \t]*\[[^\]]*\][ \t]*", re.M)


class EngineConfigError(Exception):
    """One line: the file or field, its value, and why it is refused."""

    def __init__(self, field, value, why):
        super().__init__(f"{field}={value!r}: {why}" if value != "" else f"{field}: {why}")


def _toml(text: str, where: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise EngineConfigError(where, "", f"not TOML ({exc})") from None


def _header_keys(inner: str) -> list:
    """['plugins', 'io.containerd.grpc.v1.cri', ...] of a table header's inside."""
    keys, node = [], tomllib.loads(f"[{inner}]\n")
    while node:
        [(key, node)] = node.items()
        keys.append(key)
    return keys


def _cri_lines(text: str) -> str:
    """The lines of the tables under plugins."io.containerd.grpc.v1.cri", as written."""
    out, inside = [], False
    for line in text.splitlines(keepends=True):
        match = HEADER.match(line.rstrip("\r\n"))
        if match:
            try:
                keys = _header_keys(match.group(2))
            except (tomllib.TOMLDecodeError, ValueError):
                keys = []
            inside = keys[:2] == ["plugins", CRI]
        if inside:
            out.append(line if line.endswith("\n") else line + "\n")
    return "".join(out)


def _string(value: str) -> str:
    return json.dumps(value)  # a TOML basic string for the plain paths and globs used here


def containerd_dropin(main_text: str, binary: str) -> str:
    """The drop-in for a containerd config whose text is main_text ('' where
    there is none): its CRI section plus the hami handler running binary."""
    main = _toml(main_text, CONTAINERD_CONFIG)
    version = main.get("version", 1)
    if version != 2:
        raise EngineConfigError(f"{CONTAINERD_CONFIG}: version", version,
                                "only version = 2 configs (containerd 1.5 to 1.7) are handled")
    cri = main.get("plugins", {}).get(CRI, {})
    ctr = cri.get("containerd", {})
    runtimes = ctr.get("runtimes", {})
    if HANDLER in runtimes:
        raise EngineConfigError(f'{CONTAINERD_CONFIG}: [{CRI_HEADER}.containerd.runtimes.{HANDLER}]', "",
                                "already there: remove it, or leave the handler to that config")
    lines = ["# hami-runtime's containerd drop-in, written by its node installer (uninstall removes it).\n",
             f"# containerd 1.x lets an import replace a plugin's whole section: this holds\n",
             f"# {CONTAINERD_CONFIG}'s CRI section as it was at install, plus the hami handler.\n",
             "version = 2\n\n"]
    copied = _cri_lines(main_text)
    lines.append(copied)
    default = ctr.get("default_runtime_name", "runc")
    if default not in runtimes:  # the drop-in's runtimes replace containerd's default map
        lines.append(f'\n[{CRI_HEADER}.containerd.runtimes.{default}]\n'
                     '  runtime_type = "io.containerd.runc.v2"\n')
    systemd = runtimes.get(default, {}).get("options", {}).get("SystemdCgroup")
    lines.append(f'\n[{CRI_HEADER}.containerd.runtimes.{HANDLER}]\n'
                 '  runtime_type = "io.containerd.runc.v2"\n'
                 f'  pod_annotations = [{", ".join(map(_string, POD_ANNOTATIONS))}]\n'
                 f'  container_annotations = [{", ".join(map(_string, CONTAINER_ANNOTATIONS))}]\n'
                 f'\n[{CRI_HEADER}.containerd.runtimes.{HANDLER}.options]\n'
                 f'  BinaryName = {_string(binary)}\n'
                 + (f"  SystemdCgroup = {'true' if systemd else 'false'}\n" if systemd is not None else ""))
    text = "".join(lines)
    try:
        got = tomllib.loads(text).get("plugins", {}).get(CRI, {})
    except tomllib.TOMLDecodeError as exc:
        raise EngineConfigError(CONTAINERD_CONFIG, "", f"its CRI section cannot be copied line by line ({exc})") \
            from None
    got_runtimes = got.get("containerd", {}).get("runtimes", {})
    got_runtimes.pop(HANDLER, None)
    if default not in runtimes:
        got_runtimes.pop(default, None)
    if _pruned(got) != _pruned(cri):
        raise EngineConfigError(CONTAINERD_CONFIG, "", "its CRI section cannot be copied line by line "
                                "(tables written inline or as dotted keys): write it as [plugins.\"...\"] tables")
    return text


def _pruned(value):
    """value without its empty tables (those the drop-in's additions leave behind)."""
    if not isinstance(value, dict):
        return value
    out = {k: _pruned(v) for k, v in value.items()}
    return {k: v for k, v in out.items() if v != {}}


def _resolve(pattern: str) -> str:
    return pattern if os.path.isabs(pattern) else os.path.join(os.path.dirname(CONTAINERD_CONFIG), pattern)


def imported(main_text: str) -> list:
    """The main config's imports, as absolute globs."""
    return [_resolve(p) for p in _toml(main_text, CONTAINERD_CONFIG).get("imports", [])]


def imports_edit(main_text: str):
    """(new_text, edit): the main config with an import that reads the drop-in,
    and {"original": ..., "new": ...} (the text replaced and its replacement;
    original '' for a line put first), or (main_text, None) where an import reads it already."""
    globs = imported(main_text)
    if any(fnmatch.fnmatchcase(CONTAINERD_DROPIN, g) for g in globs):
        return main_text, None
    if not globs:
        if re.search(r"^\s*imports\s*=", main_text, re.M) is None:
            new = f"imports = [{_string(CONTAINERD_IMPORT)}]\n"
            return new + main_text, {"original": "", "new": new}
    first_table = HEADER.search(main_text)
    match = IMPORTS.search(main_text)
    if match is None or (first_table and match.start() > first_table.start()):
        raise EngineConfigError(f"{CONTAINERD_CONFIG}: imports", "",
                                "not one line `imports = [...]` before the first table: add "
                                f"{_string(CONTAINERD_IMPORT)} to it by hand")
    items = _toml(main_text, CONTAINERD_CONFIG).get("imports", [])
    new = f"imports = [{', '.join(_string(x) for x in items + [CONTAINERD_IMPORT])}]"
    original = match.group(0)
    if main_text.count(original) != 1:
        raise EngineConfigError(f"{CONTAINERD_CONFIG}: imports", original, "appears more than once")
    return main_text.replace(original, new), {"original": original, "new": new}


def undo_imports(text: str, edit) -> str:
    """The main config as it was before imports_edit made `edit`; raises where
    the edited text is no longer there."""
    if edit is None:
        return text
    new, original = edit["new"], edit["original"]
    if original == "":
        if not text.startswith(new):
            raise EngineConfigError(f"{CONTAINERD_CONFIG}: imports", new.strip(), "no longer its first line")
        return text[len(new):]
    if text.count(new) != 1:
        raise EngineConfigError(f"{CONTAINERD_CONFIG}: imports", new, "no longer there once")
    return text.replace(new, original)


def crio_dropin(binary: str) -> str:
    """CRI-O's drop-in (examples/crio/hami.conf, naming binary)."""
    return ("# hami-runtime's CRI-O drop-in, written by its node installer (uninstall removes it).\n"
            f"[crio.runtime.runtimes.{HANDLER}]\n"
            f"runtime_path = {_string(binary)}\n"
            'runtime_type = "oci"\n'
            'runtime_root = "/run/runc"\n'
            "allowed_annotations = []\n")
