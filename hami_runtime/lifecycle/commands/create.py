"""create/run: read the request, allocate, prepare the host side, edit the spec
(`_prepare`: each step a call into one room of lifecycle/).

Only this edge touches files and the lock; parsing, allocation and the spec
edits are the pure modules it calls. On any refusal nothing is left behind.
A spec with no request loads only what tells it so: the modules that serve a
GPU request are imported where they are used.
"""
from __future__ import annotations

import json
import os
import pathlib
import stat
import sys
from typing import TYPE_CHECKING, NamedTuple

from ... import log, phases
from ...config import Config
from ...errors import HamiError
from ...ids import check_container_id
from ..request import docker_gpus
from ..spec_edit import spec as spec_io
from ..request.request_keys import is_pod_sandbox, mentions_request, unknown_key

if TYPE_CHECKING:
    from ..spec_edit import modifiers

IDENTITY_KEYS = ("io.kubernetes.cri.sandbox-name", "io.kubernetes.cri.sandbox-namespace",
                 "io.kubernetes.cri.container-name", "io.kubernetes.pod.name",
                 "io.kubernetes.pod.namespace", "io.kubernetes.container.name",
                 "io.container.manager", "nerdctl/name")
HOOK_ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C.UTF-8"]


MAX_IDENTITY = 256  # characters kept of each name: a Kubernetes name has at most 253


def identity(annotations: dict[str, str]) -> dict[str, str]:
    """The names the tools show, each cut: they are the tenant's text, and the
    state file every create reads has a bounded size."""
    return {k: annotations[k][:MAX_IDENTITY] for k in IDENTITY_KEYS if k in annotations}


def device_majors(cfg: Config) -> dict[str, int]:
    from ...node import discovery
    majors = discovery.read_majors(cfg.proc_devices)
    # A node that exists under the dev root is the truth for its major.
    for name, node in (("nvidia-frontend", "nvidiactl"), ("nvidia-uvm", "nvidia-uvm")):
        try:
            st = os.stat(os.path.join(cfg.dev_root, node))
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode):
            majors[name] = os.major(st.st_rdev)
    return majors


# The hook runs at every create and stop: skip site-packages processing (-S)
# and the environment (-I), importing the package from where it lies.
HOOK_CODE = ("import sys; sys.path.insert(0, {where!r}); "
             "from hami_hook.cli import main; sys.exit(main())")


def usable_launcher(path) -> bool:
    """The launcher that started this create (it says so in HAMI_LAUNCHER) runs
    the createRuntime hook as root: only a root- or our-owned file that no one
    else may write."""
    if not path or not os.path.isabs(path) or not os.path.basename(path).startswith("hami-runtime"):
        return False
    try:
        st = os.stat(path)
    except OSError:
        return False
    return (stat.S_ISREG(st.st_mode) and os.access(path, os.X_OK)
            and st.st_uid in (0, os.geteuid()) and not st.st_mode & 0o022)


def check_argv(cfg: Config, image) -> list[str]:
    """What the createRuntime hook checks the container's mounts against, once
    runc has made them (rootfs.mounted_problem, launcher/hook.c): the root, what
    it finds at /etc, the node's libvgpu. A root another container writes can
    change between the runtime's look at create and runc's mounts."""
    if image is None:
        return []
    from ..spec_edit import modifiers
    return [modifiers.CHECK_FLAG, image.root, "--etc", image.etc, "--libvgpu", cfg.libvgpu]


def create_hook_argv(cfg: Config, launcher, runc_root: str, image=None) -> list[str]:
    """The hooks through the launcher's C hook (no interpreter start inside
    runc's create and delete), unless the config names its own hook command."""
    if cfg.hook_command or not usable_launcher(launcher):
        return []
    from ..node_state.state_layout import root_key
    return [launcher, "hami-hook", "--state-dir", cfg.state_dir, "--root-key", root_key(runc_root)] + \
        check_argv(cfg, image)


def hook_argv(cfg: Config, runc_root: str, image=None) -> list[str]:
    # the directory that holds the hami_runtime and hami_hook packages
    where = str(pathlib.Path(os.path.abspath(__file__)).parents[3])
    base = list(cfg.hook_command) or [sys.executable, "-S", "-I", "-c", HOOK_CODE.format(where=where)]
    return base + ["--state-dir", cfg.state_dir, "--runc-root", runc_root] + check_argv(cfg, image)


def distinct_files(driver_files) -> list:
    """One mount per driver file and name: an ld cache that lists a library
    under two directories that are one (a merged /usr: /lib/x86_64-linux-gnu and
    /usr/lib/x86_64-linux-gnu) gives it once, where it lists it first."""
    seen, kept = set(), []
    for f in driver_files:
        key = (f.host_path, os.path.basename(f.container_path))
        if key not in seen:
            seen.add(key)
            kept.append(f)
    return kept


def build_injection(cfg: Config, runc_root: str, name: str, grants, gpus, majors, driver_files,
                    request, marker: dict, launcher=None, image=None) -> "modifiers.Injection":
    """`image`: the rootfs as rootfs.image found it (/etc's hold, the hooks' check)."""
    from ..node_state import boards, container_files, state_layout
    from ..spec_edit import modifiers
    minor_of = {g.uuid: g.minor for g in gpus}
    region_dir = state_layout.container_dir(cfg.state_dir, name)
    preload = os.path.join(state_layout.private_dir(cfg.state_dir, name), "ld.so.preload")
    mounts = [modifiers.Mount(f.host_path, f.container_path, tuple(modifiers.RO_BIND))
              for f in driver_files]
    mounts += modifiers.slice_mounts(
        cfg.libvgpu, preload, container_files.limits_path(cfg.state_dir, name), region_dir,
        boards.board_root(cfg.state_dir, boards.ACTIVITY), boards.board_root(cfg.state_dir, boards.PRIORITY))
    mounts += [modifiers.Mount(m["source"], m["destination"],
                               tuple(modifiers.RO_BIND if m["readonly"] else modifiers.RW_BIND))
               for m in cfg.extra_mounts]
    env = {f"CUDA_DEVICE_MEMORY_LIMIT_{i}": f"{g.mem_mib}m" for i, g in enumerate(grants)}
    env["CUDA_DEVICE_SM_LIMIT"] = str(grants[0].cores)
    if len({g.cores for g in grants}) > 1:
        env.update({f"CUDA_DEVICE_SM_LIMIT_{i}": str(g.cores) for i, g in enumerate(grants)})
    # What the limits file says, for HAMi-core and the workload to read: libvgpu in a
    # runtime-made container takes nothing from the env.
    env.update({
        "NVIDIA_VISIBLE_DEVICES": ",".join(g.uuid for g in grants),
        "GPU_CORE_UTILIZATION_POLICY": request.core_policy,
        "CUDA_TASK_PRIORITY": str(request.priority),
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": f"{modifiers.REGION_DIR}/vgpu.region",
    })
    if spill_flags(cfg, request):
        env["CUDA_OVERSUBSCRIBE"] = "true"
    env.update(cfg.extra_env)
    library_dirs = []
    for f in driver_files:
        directory = os.path.dirname(f.container_path)
        if os.path.basename(f.container_path).startswith("lib") and directory not in library_dirs:
            library_dirs.append(directory)
    return modifiers.Injection(
        devices=modifiers.device_nodes([minor_of[g.uuid] for g in grants], majors,
                                       mig_cap_minors(cfg, grants, gpus, majors)),
        mounts=mounts, env=env, library_dirs=library_dirs,
        hook_argv=hook_argv(cfg, runc_root, image), hook_env=list(HOOK_ENV),
        create_hook_argv=create_hook_argv(cfg, launcher, runc_root, image), marker=marker,
        etc=image.hold if image else None, dropped_capabilities=() if cfg.allow_chroot else (modifiers.CHROOT,),
        no_new_namespaces=no_new_namespaces(cfg))


def no_new_namespaces(cfg: Config):
    """Injection.no_new_namespaces: the architectures of a profile made where the
    spec has none, or None where the node allows new namespaces."""
    from ..spec_edit import modifiers
    return None if cfg.allow_user_namespaces else modifiers.seccomp_architectures(os.uname().machine)


def check_escapes(cfg: Config, spec: dict) -> None:
    """Refuses, before anything is allocated, a GPU container that could lift its
    slice: one with CAP_SYS_ADMIN (unless allow_sys_admin), or whose seccomp
    profile the runtime cannot make refuse new namespaces."""
    from ..spec_edit import modifiers
    held = [] if cfg.allow_sys_admin else modifiers.sys_admin_sets(spec)
    if held:
        raise HamiError(f"process.capabilities.{held[0]}", modifiers.SYS_ADMIN,
                        "a GPU container with it can unmount or cover what holds its slice (a "
                        "privileged container has it): refused (config allow_sys_admin = false)")
    arches = no_new_namespaces(cfg)
    if arches is not None:
        modifiers.without_new_namespaces((spec.get("linux") or {}).get("seccomp"), arches)


def mig_cap_minors(cfg: Config, grants, gpus, majors) -> list[int]:
    """The nvidia-caps minors of the MIG instances granted (none: nothing read)."""
    instances = [gpu for g in grants for gpu in gpus if gpu.uuid == g.uuid and gpu.is_mig]
    if not instances:
        return []
    from ...node import mig_caps
    if mig_caps.MAJOR_NAME not in majors:
        raise HamiError("config proc_devices", cfg.proc_devices,
                        f"lists no {mig_caps.MAJOR_NAME} major: MIG instances cannot be given")
    minors = mig_caps.read(cfg.mig_minors)
    return [m for gpu in instances for m in mig_caps.access_minors(minors, gpu, cfg.mig_minors)]


def spill_flags(cfg: Config, request) -> int:
    """The region's device flags: where the node oversubscribes (memory_scaling > 1), a
    container's allocations the card cannot hold spill to managed memory, unless it opted
    out (hami.io/oversubscribe: "false")."""
    from ...node import region
    return region.DEVICE_SPILL if cfg.memory_scaling > 1 and request.oversubscribe else 0


def _prepare_host_side(cfg: Config, name: str, cid: str, inv, grants, request, creator: dict
                       ) -> None:
    from ..node_state import boards, container_files, state_layout
    from ..spec_edit import modifiers
    from ...node import region
    from ...files import atomic_write
    region_dir, private = state_layout.make_dirs(cfg.state_dir, name)
    # every container stamps and is on the activity board; the priority board
    # links only high-priority ones
    uuids = [g.uuid for g in grants]
    boards.make_stamps(cfg.state_dir, name, uuids)
    boards.join(cfg.state_dir, name, uuids)
    boards.set_priority(cfg.state_dir, name, uuids, request.priority)
    # The region file is 0666 (any container user maps it); the dir stays the host's.
    os.chmod(region_dir, 0o755)
    flags = spill_flags(cfg, request)
    container_files.make(
        cfg.state_dir, name, [region.DeviceLimit(g.uuid, g.mem_mib << 20, g.cores, flags) for g in grants],
        request.core_policy, request.priority, cfg.priority_idle_ms)
    atomic_write(os.path.join(private, "ld.so.preload"),
                 (modifiers.LIBVGPU_PATH + "\n").encode(), 0o644)
    owner = {"id": cid, "runc_root": inv.root, "bundle": inv.bundle, "creator": creator}
    atomic_write(os.path.join(private, "owner.json"), json.dumps(owner).encode(), 0o600)


def _passed_through(cfg: Config, cid: str, annotations, env, why: str = "") -> bool:
    """The log line of a container whose spec stays as it came."""
    from ..request.request_keys import mentioned_keys
    keys = mentioned_keys(annotations, env, cfg.env_requests)
    if keys and not why and is_pod_sandbox(annotations):
        why = "the pod's sandbox container, which runs no GPU work"
    if why:
        log.write(cfg, "info", f"{cid}: passed through untouched: {why}")
    elif keys:  # only keys that shape a request, or NVIDIA_VISIBLE_DEVICES=none
        log.write(cfg, "info", f"{cid}: passed through untouched: {', '.join(keys)} ask(s) "
                  "for no GPU (a request needs gpu, gpumem, gpumem-percentage, gpucores, "
                  "gpu-uuid or vgpu-devices-allocated)")
    else:
        log.write(cfg, "debug", f"{cid}: no GPU request, passed through")
    return False


def _allocate(cfg: Config, request, pinned, gpus, state):
    """Grants for the request: on the GPUs a restarted container had where they
    still fit it, else as any request."""
    from ..node_state import allocator
    args = dict(split_count=cfg.split_count, memory_scaling=cfg.memory_scaling,
                default_memory_mib=cfg.default_memory_mib, default_cores=cfg.default_cores,
                policy=cfg.policy, invalid=state.invalid)
    again = request.pinned_to(pinned) if pinned else None
    if again is not None:
        try:
            return allocator.allocate(again, gpus, state.allocations.values(), **args), True
        except HamiError:
            pass  # its GPUs are taken meanwhile: wherever the request fits
    return allocator.allocate(request, gpus, state.allocations.values(), **args), False


def _holds_and_runs(state, runc_root: str):
    """running(record) for pod_ledger.place: the record's container has an
    allocation here and runs (or its create does)."""
    from ..node_state import state_layout, store

    def running(record) -> bool:
        name = state_layout.alloc_name(runc_root, record["id"])
        entry = state.allocations.get(name) or (state.invalid.get(name) or {}).get("entry")
        return isinstance(entry, dict) and store.entry_running(entry)
    return running


def prepare(cfg: Config, inv, launcher=None, creator=None) -> bool:
    """True when the spec was edited for a GPU request; False when it had none
    and stays byte for byte as it came (but for dockerd's GPU hook, which never
    stays). `launcher`: the C launcher that started this process, if any;
    `creator`: the pid that becomes runc (this process unless given)."""
    cid = check_container_id(inv.container_id)
    spec = spec_io.load(inv.bundle)
    phases.mark("spec_read")
    gpu_hooks = docker_gpus.gpu_hooks(spec)
    if gpu_hooks and not cfg.env_requests:
        raise HamiError("docker --gpus", " ".join(gpu_hooks[0].get("args") or []),
                        "this node takes no env requests (config env_requests = false)")
    if _prepare(cfg, cid, inv, spec, launcher, os.getpid() if creator is None else creator):
        return True
    if gpu_hooks:
        spec_io.write(inv.bundle, docker_gpus.without_gpu_hooks(spec))
        log.write(cfg, "info", f"{cid}: dockerd's GPU hook removed: the container gets no GPU")
    return False


def _prepare(cfg: Config, cid: str, inv, spec: dict, launcher, pid: int) -> bool:
    """The four steps, each in one room: what the container asks (request/), what the
    node gives it (node_state/), its files on the host (node_state/), its spec
    (spec_edit/). A step that finds no GPU to give passes the container through."""
    asked = _request(cfg, cid, spec)
    if not asked.wants_gpu:
        return _passed_through(cfg, asked.who, asked.annotations, asked.env, asked.why)
    held = _allocation(cfg, cid, inv, spec, asked, pid)
    if held.request is None:
        return _passed_through(cfg, asked.who, asked.annotations, asked.env, held.how)
    # The entry is committed and lives while this process (then runc) does, so
    # the files are written outside the lock; a failure or a kill from here on
    # is freed by the release below or by the next transaction.
    from ..node_state import store
    try:
        _prepare_host_side(cfg, held.name, cid, inv, held.grants, held.request, held.creator)
        phases.mark("host_files")
        _edit_spec(cfg, inv, spec, held, launcher)
    except BaseException:
        store.discard(cfg.state_dir, held.name, held.creator)
        raise
    names = {gpu.uuid: gpu.name for gpu in held.gpus}  # "1", or "1:0" for a MIG instance
    log.write(cfg, "info", f"{asked.who}: allocated " + ", ".join(
        f"GPU {names[g.uuid]} {g.mem_mib}MiB {g.cores}%" for g in held.grants) +
        (f" ({held.how})" if held.how else ""))
    phases.mark("log")
    return True


class Asked(NamedTuple):
    """What the container asks: whether it wants a GPU (else why not), the pod member
    it is, and its plan (pod_requests.plan: its request, or its pod's ledger decides)."""
    annotations: dict
    env: list
    who: str
    wants_gpu: bool
    why: str = ""
    member: object = None
    plan: object = None


def _request(cfg: Config, cid: str, spec: dict) -> Asked:
    annotations = spec.get("annotations") or {}
    env = (spec.get("process") or {}).get("env") or []
    misspelt = None if is_pod_sandbox(annotations) else unknown_key(annotations)
    if misspelt:
        raise HamiError("annotation", misspelt[0], "not a request key of this runtime nor one HAMi's "
                        f"scheduler writes; the nearest is {misspelt[1]}")
    if not mentions_request(annotations, env, cfg.env_requests):
        return Asked(annotations, env, cid, False)
    # Only now the request model, NVML and the allocator are loaded.
    from ..request import pod_identity, pod_requests, requests
    member = pod_identity.member(annotations)
    plan = pod_requests.plan(annotations, env, cfg.env_requests, cfg.core_policy, member)
    who = f"{cid} ({member.describe()})" if member is not None else cid
    if plan.kind == pod_requests.UNTOUCHED:
        return Asked(annotations, env, who, False, plan.why)
    if plan.kind == pod_requests.ALONE:
        request = requests.for_visible_devices_alone(plan.request, cfg.visible_devices_alone,
                                                     cfg.split_count, cfg.default_memory_mib)
        if plan.request is not None and request is None:
            return Asked(annotations, env, who, False, "NVIDIA_VISIBLE_DEVICES names no size, and the "
                         "node's visible_devices_alone is none")
        plan = plan._replace(request=request)
    if plan.kind in (pod_requests.ALONE, pod_requests.NAMED) and plan.request is None:
        return Asked(annotations, env, who, False)
    phases.mark("request")
    return Asked(annotations, env, who, True, plan.why, member, plan)


class Held(NamedTuple):
    """What the node gave: the allocation entry's name, its grants (request None: the
    pod's ledger gave it none), and what the spec edit needs of the node."""
    name: str
    creator: dict
    request: object
    grants: list
    how: str
    marker: dict
    gpus: list
    majors: dict
    driver_files: list
    image: object


def _allocation(cfg: Config, cid: str, inv, spec: dict, asked: Asked, pid: int) -> Held:
    """Refused before anything is allocated: what could lift the slice, a missing
    libvgpu, a rootfs the runtime cannot hold. Then the node's GPUs (NVML's start,
    where the discovery cache misses, beside the rest) and driver files, and the
    allocation, under the state's lock."""
    import time
    from ..node_state import state_layout
    from ...node import discovery_cache
    check_escapes(cfg, spec)
    if not os.path.isfile(cfg.libvgpu):
        raise HamiError("config libvgpu", cfg.libvgpu, "file not found")
    state_layout.make_state_dir(cfg.state_dir)  # before its caches are read
    # Where the discovery cache misses, NVML starts now and runs beside the rest of the block.
    with discovery_cache.gpus_beside(cfg) as node_gpus:
        phases.mark("gpus")
        from ..node_state import store
        from ..request import pod_requests, requests, requirements
        from ..spec_edit import rootfs
        from ...files import process_start
        from ...node import driver_capabilities
        # Used later (the allocation, the host files) but imported here: a cold create
        # imports them while NVML runs.
        from ..node_state import allocator, boards, container_files  # noqa: F401
        from ...node import region  # noqa: F401
        image = rootfs.image(inv.bundle, spec)  # refused before anything is allocated
        phases.mark("checks")
        majors = device_majors(cfg)
        phases.mark("majors")
        env = requests.env_map(asked.env)
        capabilities = driver_capabilities.parse(env.get(driver_capabilities.VARIABLE))
        driver_files = distinct_files(driver_capabilities.chosen(discovery_cache.driver_files(cfg), capabilities))
        phases.mark("driver_files")
        phases.note(f"{len(driver_files)} driver files mounted")
        gpus = node_gpus()
        phases.mark("gpus_waited")
    name = state_layout.alloc_name(inv.root, cid)
    creator = {"pid": pid, "start": process_start(pid)}
    member, plan = asked.member, asked.plan
    request, how, refusal, grants, marker = plan.request, plan.why, None, [], {}
    with store.transaction(cfg.state_dir) as state:
        if name in state.allocations or name in state.invalid:
            raise HamiError("container id", cid, f"already has a GPU allocation under {inv.root}")
        if os.path.lexists(os.path.join(inv.root, cid)):
            raise HamiError("container id", cid, f"a container with this id exists under {inv.root}")
        placed = pinned = None
        if member is not None and plan.kind != pod_requests.ALONE:
            from ..node_state import pod_ledger
            key = pod_ledger.pod_key(inv.root, member.sandbox)
            placed = pod_ledger.place(state.pods.get(key), member, inv.root, cid, creator, plan,
                                      _holds_and_runs(state, inv.root))
            for old in placed.release:
                state.release(state_layout.alloc_name(inv.root, old))
            state.pods[key] = placed.ledger
            request, how, pinned, refusal = placed.request, placed.why, placed.pinned, placed.refusal
        if request is not None:
            try:
                grants, again = _allocate(cfg, request, pinned, gpus, state)
            except HamiError as exc:
                if placed is None:
                    raise
                refusal = exc  # the pod's record of this container is kept all the same
        if request is not None and refusal is None:
            granted = [next(gpu for gpu in gpus if gpu.uuid == g.uuid) for g in grants]
            requirements.check(env, requirements.NodeFacts(
                cuda=granted[0].cuda, driver=granted[0].driver,
                gpus=[{"arch": gpu.arch, "brand": gpu.brand} for gpu in granted]))
            if placed is not None:
                placed.ledger["containers"][member.name]["uuids"] = [g.uuid for g in grants]
                how += ", on the GPUs it had before its restart" if again else ""
            entry = {
                "id": cid, "runc_root": inv.root, "bundle": inv.bundle,
                "devices": [g.to_json() for g in grants],
                "core_policy": request.core_policy, "priority": request.priority,
                "oversubscribe": request.oversubscribe,
                "identity": identity(asked.annotations), "request": dict(request.keys),
                "created_at": time.time(), "pid": 0,
            }
            if placed is not None:
                entry["pod"] = {"sandbox": member.sandbox, "container": member.name,
                                "position": placed.position, "slice": placed.slice}
            marker = {k: v for k, v in entry.items() if k not in ("runc_root", "bundle")}
            entry["creator"] = creator
            state.allocations[name] = entry
    phases.mark("allocation")
    if refusal is not None:
        raise refusal
    return Held(name, creator, request, grants, how, marker, gpus, majors, driver_files, image)


def _edit_spec(cfg: Config, inv, spec: dict, held: Held, launcher) -> None:
    from ..spec_edit import modifiers
    injection = build_injection(cfg, inv.root, held.name, held.grants, held.gpus, held.majors, held.driver_files,
                                held.request, held.marker, launcher, held.image)
    phases.mark("injection")  # the mounts, env and hooks
    edited = modifiers.apply(json.loads(json.dumps(spec)), injection)
    phases.mark("spec_edit")
    spec_io.write(inv.bundle, edited)
    phases.mark("spec_write")
