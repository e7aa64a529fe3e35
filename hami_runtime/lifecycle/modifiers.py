"""Spec edits: small modifiers over a plain dict spec, applied in order.

Each takes (spec, injection) and returns the spec; each is idempotent (it
replaces its own earlier edit rather than adding a second one), so editing an
already edited spec converges.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import NamedTuple

from .docker_gpus import without_gpu_hooks

# Where libvgpu looks (libvgpu_src/region.h: HAMI_LIMITS_PATH, HAMI_RUNTIME_*; a
# test checks that they agree).
VGPU_DIR = "/usr/local/vgpu"
LIBVGPU_PATH = f"{VGPU_DIR}/libvgpu.so"
LIMITS_PATH = f"{VGPU_DIR}/limits"      # the host's limits file, read-only
REGION_DIR = f"{VGPU_DIR}/shared"
ACTIVITY_BOARD_DIR = f"{VGPU_DIR}/activity"   # the activity board, read-only
PRIORITY_BOARD_DIR = f"{VGPU_DIR}/priority"   # the priority board, read-only
PRELOAD_PATH = "/etc/ld.so.preload"
MARKER = "hami.io/allocation"
NVIDIA_MAJOR = 195
RO_BIND = ["bind", "ro", "nosuid", "nodev"]
RW_BIND = ["bind", "rw", "nosuid", "nodev"]


class DeviceNode(NamedTuple):
    path: str
    major: int
    minor: int


class Mount(NamedTuple):
    source: str
    destination: str
    options: tuple[str, ...]


class Injection(NamedTuple):
    """Everything the modifiers put into a spec, decided before editing (read only)."""
    devices: Sequence[DeviceNode] = ()
    mounts: Sequence[Mount] = ()          # driver files, libvgpu, region, extras
    env: Mapping[str, str] = MappingProxyType({})
    library_dirs: Sequence[str] = ()      # appended to LD_LIBRARY_PATH
    hook_argv: Sequence[str] = ()         # [path, args...]; poststop/createRuntime appended
    hook_env: Sequence[str] = ()
    create_hook_argv: Sequence[str] = ()  # createRuntime's own (the launcher's C hook); (): hook_argv
    marker: object = None


def device_nodes(minors: Sequence[int], majors: dict[str, int],
                 cap_minors: Sequence[int] = ()) -> list[DeviceNode]:
    """/dev/nvidiaN for the allocated GPUs (a GPU once, however many of its MIG
    instances), the control node, UVM when the driver registered it, and the
    nvidia-caps nodes of MIG instances (`cap_minors`; their major is known when
    there are any)."""
    frontend = majors.get("nvidia-frontend", majors.get("nvidia", NVIDIA_MAJOR))
    nodes = [DeviceNode(f"/dev/nvidia{m}", frontend, m) for m in dict.fromkeys(minors)]
    nodes.append(DeviceNode("/dev/nvidiactl", frontend, 255))
    if "nvidia-uvm" in majors:
        nodes.append(DeviceNode("/dev/nvidia-uvm", majors["nvidia-uvm"], 0))
        nodes.append(DeviceNode("/dev/nvidia-uvm-tools", majors["nvidia-uvm"], 1))
    nodes += [DeviceNode(f"/dev/nvidia-caps/nvidia-cap{m}", majors["nvidia-caps"], m) for m in cap_minors]
    return nodes


def _linux(spec: dict) -> dict:
    return spec.setdefault("linux", {})


def add_device_nodes(spec: dict, inj: Injection) -> dict:
    paths = {d.path for d in inj.devices}
    kept = [d for d in _linux(spec).get("devices") or [] if d.get("path") not in paths]
    kept += [{"path": d.path, "type": "c", "major": d.major, "minor": d.minor,
              "fileMode": 0o666, "uid": 0, "gid": 0} for d in inj.devices]
    _linux(spec)["devices"] = kept
    return spec


def allow_device_access(spec: dict, inj: Injection) -> dict:
    resources = _linux(spec).setdefault("resources", {})
    rules = resources.get("devices") or []
    for d in inj.devices:
        rule = {"allow": True, "type": "c", "major": d.major, "minor": d.minor, "access": "rwm"}
        if rule not in rules:
            rules.append(rule)
    resources["devices"] = rules
    return spec


def add_mounts(spec: dict, inj: Injection) -> dict:
    targets = {m.destination for m in inj.mounts}
    kept = [m for m in spec.get("mounts") or [] if m.get("destination") not in targets]
    kept += [{"destination": m.destination, "type": "bind", "source": m.source,
              "options": list(m.options)} for m in inj.mounts]
    spec["mounts"] = kept
    return spec


def set_env(spec: dict, inj: Injection) -> dict:
    process = spec.setdefault("process", {})
    env = list(process.get("env") or [])
    names = set(inj.env)
    if inj.library_dirs:
        old = next((e.split("=", 1)[1] for e in env if e.startswith("LD_LIBRARY_PATH=")), "")
        dirs = [d for d in old.split(":") if d]
        dirs += [d for d in inj.library_dirs if d not in dirs]
        names.add("LD_LIBRARY_PATH")
        extra = {"LD_LIBRARY_PATH": ":".join(dirs)}
    else:
        extra = {}
    env = [e for e in env if e.partition("=")[0] not in names]
    env += [f"{k}={v}" for k, v in {**inj.env, **extra}.items()]
    process["env"] = env
    return spec


def add_hooks(spec: dict, inj: Injection) -> dict:
    """createRuntime records the host PID; poststop frees the allocation. With
    the launcher's C hook, createRuntime is that hook and there is no poststop
    (hami-runtime delete and every later allocator transaction free it)."""
    if not inj.hook_argv:
        return spec
    hooks = spec.setdefault("hooks", {})
    ours = [list(argv) for argv in (inj.hook_argv, inj.create_hook_argv) if argv]
    for stage in ("createRuntime", "poststop"):
        argv = list(inj.create_hook_argv if stage == "createRuntime" and inj.create_hook_argv
                    else inj.hook_argv)
        kept = [h for h in hooks.get(stage) or []
                if not any((h.get("args") or [])[:len(mine)] == mine for mine in ours)]
        if stage == "createRuntime" or not inj.create_hook_argv:
            kept.append({"path": argv[0], "args": argv + [stage],
                         "env": list(inj.hook_env), "timeout": 30})
        if kept:
            hooks[stage] = kept
        else:
            hooks.pop(stage, None)
    return spec


def mark_allocation(spec: dict, inj: Injection) -> dict:
    if inj.marker is not None:
        spec.setdefault("annotations", {})[MARKER] = json.dumps(inj.marker, sort_keys=True)
    return spec


MODIFIERS: tuple[Callable[[dict, Injection], dict], ...] = (
    add_device_nodes, allow_device_access, add_mounts, set_env, add_hooks, without_gpu_hooks,
    mark_allocation)


def apply(spec: dict, inj: Injection, modifiers=MODIFIERS) -> dict:
    for modify in modifiers:
        spec = modify(spec, inj)
    return spec
