"""Spec edits: small modifiers over a plain dict spec, applied in order.

Each takes (spec, injection) and returns the spec; each is idempotent (it
replaces its own earlier edit rather than adding a second one), so editing an
already edited spec converges.
"""
from __future__ import annotations

import json
import posixpath
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import NamedTuple

from ...errors import HamiError
from ..request.docker_gpus import without_gpu_hooks

# Where libvgpu and the loader find what holds the slice: under one root-level
# mount point, each file itself a mount point, so that no rename in the container
# takes one off its path (the kernel refuses to rename a mount point, and nothing
# above /.hami but the root). libvgpu_src/region.h says the same (HAMI_LIMITS_PATH,
# HAMI_RUNTIME_*; a test checks that they agree).
HAMI_DIR = "/.hami"
LIBVGPU_PATH = f"{HAMI_DIR}/libvgpu.so"
LIMITS_PATH = f"{HAMI_DIR}/limits"      # the host's limits file, read-only
REGION_DIR = f"{HAMI_DIR}/shared"
ACTIVITY_BOARD_DIR = f"{HAMI_DIR}/activity"   # the activity board, read-only
PRIORITY_BOARD_DIR = f"{HAMI_DIR}/priority"   # the priority board, read-only
VGPU_LIBVGPU_PATH = "/usr/local/vgpu/libvgpu.so"  # where HAMi-core's users name it; nothing reads it
ETC = "/etc"
PRELOAD_PATH = "/etc/ld.so.preload"
MARKER = "hami.io/allocation"
NVIDIA_MAJOR = 195
RO_BIND = ["bind", "ro", "nosuid", "nodev"]
RW_BIND = ["bind", "rw", "nosuid", "nodev"]
# /.hami itself: an empty read-only tmpfs that holds only mount points (runc makes
# them before it turns the tmpfs read-only)
HAMI_TMPFS = ["ro", "nosuid", "nodev", "noexec", "mode=755", "size=64k"]
CHROOT = "CAP_SYS_CHROOT"
CHECK_FLAG = "--rootfs"  # the first of the createRuntime hook's checks (create.check_argv)
SYS_ADMIN = "CAP_SYS_ADMIN"

# New namespaces, refused in GPU containers by seccomp rules of the runtime's own
# (config allow_user_namespaces keeps the engine's profile as it is). In a user
# namespace of its own the tenant holds every capability over a mount namespace of
# its own, where it can unmount or cover /etc/ld.so.preload and /.hami; the other
# kinds need CAP_SYS_ADMIN already, and are refused alike, as Docker's profile does.
NAMESPACE_FLAGS = {"CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
                   "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
                   "CLONE_NEWNET": 0x40000000}
NAMESPACE_MASK = sum(NAMESPACE_FLAGS.values())  # 0x7e020000, the mask of Docker's clone rule
# refused with any namespace flag in argument 0 (their flags on every architecture below)
FLAGGED_SYSCALLS = ("clone", "unshare")
# refused whatever their arguments: setns (joining a namespace: nstype 0 means any kind),
# clone3 (its flags are in a struct seccomp cannot read) with ENOSYS, so that libc falls
# back to clone, as Docker's profile answers it
EPERM, ENOSYS = 1, 38
WHOLLY_REFUSED = {"setns": EPERM, "clone3": ENOSYS}
# a profile made where the spec has none: the node's architecture and its 32-bit modes,
# as Docker's and podman's profiles list them
SECCOMP_ARCHITECTURES = {
    "x86_64": ("SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"),
    "aarch64": ("SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"),
    "ppc64le": ("SCMP_ARCH_PPC64LE",),
}
REFUSING_ACTIONS = ("SCMP_ACT_ERRNO", "SCMP_ACT_KILL", "SCMP_ACT_KILL_PROCESS", "SCMP_ACT_KILL_THREAD",
                    "SCMP_ACT_TRAP")


class DeviceNode(NamedTuple):
    path: str
    major: int
    minor: int


class Mount(NamedTuple):
    source: str
    destination: str
    options: tuple[str, ...]
    type: str = "bind"


def slice_mounts(libvgpu: str, preload: str, limits: str, region_dir: str, activity: str,
                 priority: str) -> list[Mount]:
    """What holds the slice (host paths in, mounts out, in mount order): /.hami
    first, then each file and dir in it; the preload file, naming /.hami's
    libvgpu; libvgpu once more where HAMi-core's users look for it."""
    ro, rw = tuple(RO_BIND), tuple(RW_BIND)
    return [Mount("tmpfs", HAMI_DIR, tuple(HAMI_TMPFS), "tmpfs"),
            Mount(libvgpu, LIBVGPU_PATH, ro),
            Mount(limits, LIMITS_PATH, ro),
            Mount(region_dir, REGION_DIR, rw),
            Mount(activity, ACTIVITY_BOARD_DIR, ro),
            Mount(priority, PRIORITY_BOARD_DIR, ro),
            Mount(preload, PRELOAD_PATH, ro),
            Mount(libvgpu, VGPU_LIBVGPU_PATH, ro)]


class EtcHold(NamedTuple):
    """How /etc becomes a mount point of its own: a mount placed before every mount
    at or under /etc, or a path runc binds onto itself (recursively, so keeping
    what is mounted under it) read-only after every mount (linux.readonlyPaths)."""
    mount: Mount | None = None
    readonly_path: str | None = None


def etc_hold(etc_source: str | None, readonly: bool) -> EtcHold:
    """/etc a mount point for a root that is read-only or not (`readonly`), whose
    /etc is at `etc_source` on the host (None: the image has none). A writable
    root's /etc is bound onto itself; a read-only root's is in readonlyPaths, as
    runc makes the mount points under it (the preload's) only while the root is
    writable; where the image has no /etc, an empty tmpfs stands for the
    directory runc would have made (read-only with a read-only root: runc makes
    a tmpfs read-only after the mounts in it)."""
    ro = ("ro",) if readonly else ()
    if etc_source is None:
        return EtcHold(Mount("tmpfs", ETC, ro + ("nosuid", "nodev", "mode=755"), "tmpfs"))
    if readonly:
        return EtcHold(readonly_path=ETC)
    return EtcHold(Mount(etc_source, ETC, ("bind",)))


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
    etc: EtcHold | None = None            # /etc's own mount point (etc_hold), or None
    dropped_capabilities: Sequence[str] = ()  # taken from every set of process.capabilities
    # new namespaces refused by seccomp rules (refuse_new_namespaces): the architectures
    # of a profile made where the spec has none; None: the spec's seccomp stays as it is
    no_new_namespaces: Sequence[str] | None = None


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


def _mount(m: Mount) -> dict:
    return {"destination": m.destination, "type": m.type, "source": m.source, "options": list(m.options)}


def _normal(destination) -> str:
    return posixpath.normpath("/" + str(destination).lstrip("/"))


def add_mounts(spec: dict, inj: Injection) -> dict:
    targets = {m.destination for m in inj.mounts}
    kept = [m for m in spec.get("mounts") or [] if m.get("destination") not in targets]
    kept += [_mount(m) for m in inj.mounts]
    spec["mounts"] = kept
    return spec


def hold_etc(spec: dict, inj: Injection) -> dict:
    """/etc a mount point (inj.etc), so that renaming /etc, which would take
    /etc/ld.so.preload off the loader's path, is refused. A mount goes before
    every mount at or under /etc the spec has (the engine's /etc/hosts, the
    preload ...), which it would cover otherwise; a spec that mounts /etc
    itself has its mount point already."""
    if inj.etc is None:
        return spec
    ours = _mount(inj.etc.mount) if inj.etc.mount else None
    mounts = [m for m in spec.get("mounts") or [] if m != ours]
    places = [_normal(m.get("destination", "")) for m in mounts]
    if ETC not in places:
        if ours:
            under = [i for i, p in enumerate(places) if p.startswith(ETC + "/")]
            mounts.insert(under[0] if under else len(mounts), ours)
        if inj.etc.readonly_path:
            paths = _linux(spec).get("readonlyPaths") or []
            _linux(spec)["readonlyPaths"] = paths + [ETC] * (ETC not in paths)
    spec["mounts"] = mounts
    return spec


def drop_capabilities(spec: dict, inj: Injection) -> dict:
    """inj.dropped_capabilities out of every set the spec gives (a spec that
    names none has none)."""
    caps = (spec.get("process") or {}).get("capabilities")
    if inj.dropped_capabilities and isinstance(caps, dict):
        for kind, names in caps.items():
            if isinstance(names, list):
                caps[kind] = [c for c in names if c not in inj.dropped_capabilities]
    return spec


def sys_admin_sets(spec: dict) -> list[str]:
    """The sets of process.capabilities that hold CAP_SYS_ADMIN (a privileged
    container's hold every capability)."""
    caps = (spec.get("process") or {}).get("capabilities")
    if not isinstance(caps, dict):
        return []
    return [kind for kind, names in caps.items()
            if isinstance(names, list) and any(str(c).upper() == SYS_ADMIN for c in names)]


def seccomp_architectures(machine: str) -> tuple[str, ...]:
    """The architectures of a profile made for a spec without one, on a node of
    `machine` (os.uname().machine)."""
    arches = SECCOMP_ARCHITECTURES.get("aarch64" if machine == "arm64" else machine)
    if arches is None:
        raise HamiError("host architecture", machine, "the runtime refuses new namespaces in GPU "
                        f"containers on {', '.join(SECCOMP_ARCHITECTURES)} only (config "
                        "allow_user_namespaces = true leaves them to the engine)")
    return arches


def _masked(mask: int, value: int) -> dict:
    return {"index": 0, "value": mask, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"}


def _namespace_rules() -> list:
    """The runtime's own rules, one syscall each, in the order they are added; made
    anew for each spec (a tenth of what a deep copy of them costs)."""
    return ([{"names": [name], "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM, "args": [_masked(flag, flag)]}
             for name in FLAGGED_SYSCALLS for flag in NAMESPACE_FLAGS.values()]
            + [{"names": [name], "action": "SCMP_ACT_ERRNO", "errnoRet": errno}
               for name, errno in WHOLLY_REFUSED.items()])


NAMESPACE_RULES = tuple(_namespace_rules())
# what an engine's rule that lets clone or unshare through unconditionally becomes:
# through only without a namespace flag (Docker's clone rule)
WITHOUT_NAMESPACES = _masked(NAMESPACE_MASK, 0)
_LOWEST_FLAG = min(NAMESPACE_FLAGS.values())


def _excludes_namespaces(cond) -> bool:
    """True where a condition on argument 0 holds only for flags without a namespace flag."""
    op, value, two = cond.get("op"), cond.get("value", 0), cond.get("valueTwo", 0)
    if not isinstance(value, int) or not isinstance(two, int) or cond.get("index") != 0:
        return False
    return ((op == "SCMP_CMP_MASKED_EQ" and value & NAMESPACE_MASK == NAMESPACE_MASK and not two & NAMESPACE_MASK)
            or (op == "SCMP_CMP_EQ" and not value & NAMESPACE_MASK)
            or (op == "SCMP_CMP_LT" and value <= _LOWEST_FLAG)
            or (op == "SCMP_CMP_LE" and value < _LOWEST_FLAG))


def _conditions(args: list) -> list:
    """A rule's conditions as runc reads them (valueTwo 0 where left out)."""
    return [(a.get("index"), a.get("value", 0), a.get("valueTwo", 0), a.get("op")) for a in args]


def _narrowed(args: list, where: str, names: list[str]) -> list:
    """The conditions of an engine's rule that lets clone or unshare through, so
    that it holds only without a namespace flag. runc ANDs a rule's conditions
    when each is on an argument of its own, else adds each as a rule of its own."""
    if not args:
        return [WITHOUT_NAMESPACES]
    indices = [a.get("index") for a in args]
    if len(set(indices)) == len(indices):
        first = [a for a in args if a.get("index") == 0]
        if not first:
            return list(args) + [WITHOUT_NAMESPACES]
        if _excludes_namespaces(first[0]):
            return list(args)
    elif all(_excludes_namespaces(a) for a in args):
        return list(args)
    raise HamiError(where, json.dumps(args), f"lets {' and '.join(names)} through on a condition the "
                    "runtime cannot narrow to exclude new namespaces (config allow_user_namespaces = "
                    "true leaves the profile to the engine)")


def without_new_namespaces(profile, architectures: Sequence[str]) -> dict:
    """`profile` (the spec's linux.seccomp; None: none) with clone and unshare refused
    (EPERM) where a namespace flag is set, setns refused (EPERM) and clone3 answered
    ENOSYS, every other rule kept. A syscall's unconditional rule hides the
    conditional rules libseccomp is given beside it, whatever their action: an
    engine's rule that lets one of them through is narrowed (clone and unshare:
    only without a namespace flag) or goes (setns, clone3). A spec without a
    profile gets one that allows the rest, for `architectures`."""
    if profile is None:
        return {"defaultAction": "SCMP_ACT_ALLOW", "architectures": list(architectures),
                "syscalls": _namespace_rules()}
    rules = profile.get("syscalls") if isinstance(profile, dict) else None
    if not isinstance(profile, dict) or not isinstance(rules or [], list):
        raise HamiError("linux.seccomp", json.dumps(profile), "is not a seccomp profile")
    kept, refused = [], []
    ours = set(FLAGGED_SYSCALLS) | set(WHOLLY_REFUSED)
    for i, rule in enumerate(rules or []):
        names, args = (rule.get("names") or [], rule.get("args") or []) if isinstance(rule, dict) else (0, 0)
        if not (isinstance(names, list) and all(isinstance(n, str) for n in names)
                and isinstance(args, list) and all(isinstance(a, dict) for a in args)):
            raise HamiError(f"linux.seccomp.syscalls[{i}]", json.dumps(rule), "is not a seccomp rule")
        if rule in NAMESPACE_RULES:
            continue  # the runtime's own, added again below
        mine = [n for n in names if n in ours]
        if not mine or rule.get("action") in REFUSING_ACTIONS:
            kept.append(rule)
            refused += [(n, _conditions(args)) for n in mine]
            continue
        if len(mine) < len(names):
            kept.append({**rule, "names": [n for n in names if n not in mine]})
        flagged = [n for n in mine if n in FLAGGED_SYSCALLS]
        if flagged:
            kept.append({**rule, "names": flagged,
                         "args": _narrowed(args, f"linux.seccomp.syscalls[{i}]", flagged)})
    # where the engine refuses a syscall already (unconditionally, or on the same condition)
    # a rule of ours beside it would be hidden or clash (libseccomp: "file exists")
    kept += [r for r in _namespace_rules()
             if not any(n == r["names"][0] and (not conditions or conditions == _conditions(r.get("args")))
                        for n, conditions in refused)]
    return {**profile, "syscalls": kept}


def refuse_new_namespaces(spec: dict, inj: Injection) -> dict:
    """No new namespace in the container (inj.no_new_namespaces): the spec's
    seccomp profile, or one it is given, refuses them (without_new_namespaces)."""
    if inj.no_new_namespaces is None:
        return spec
    linux = _linux(spec)
    linux["seccomp"] = without_new_namespaces(linux.get("seccomp"), inj.no_new_namespaces)
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


def _hook_identity(argv: list) -> list:
    """A hook's argv up to what it checks (create.check_argv): what makes it ours."""
    return argv[:argv.index(CHECK_FLAG)] if CHECK_FLAG in argv else argv


def add_hooks(spec: dict, inj: Injection) -> dict:
    """createRuntime records the host PID; poststop frees the allocation. With
    the launcher's C hook, createRuntime is that hook and there is no poststop
    (hami-runtime delete and every later allocator transaction free it)."""
    if not inj.hook_argv:
        return spec
    hooks = spec.setdefault("hooks", {})
    # ours whatever it was to check (the root and /etc of an earlier create of the bundle)
    ours = [_hook_identity(list(argv)) for argv in (inj.hook_argv, inj.create_hook_argv) if argv]
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
    add_device_nodes, allow_device_access, add_mounts, hold_etc, drop_capabilities, refuse_new_namespaces,
    set_env, add_hooks, without_gpu_hooks, mark_allocation)


def apply(spec: dict, inj: Injection, modifiers=MODIFIERS) -> dict:
    for modify in modifiers:
        spec = modify(spec, inj)
    return spec
