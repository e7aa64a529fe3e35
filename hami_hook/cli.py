"""hami-hook: the OCI hook hami-runtime puts into GPU containers.

  hami-hook --state-dir DIR --runc-root DIR [--rootfs ROOT --etc bind|dir|mount
            --libvgpu PATH] createRuntime|poststop  < OCI state

createRuntime, with --rootfs (the runtime always gives it), checks that the
container's mount tree, once runc has made it, holds the preload and /.hami as
the runtime meant them (rootfs.mounted_problem: what the launcher's C hook
checks, with the same lines) and fails the create in one line otherwise; then
it records the container's host PID beside its allocation
(private/<id>@<root key>/pid; the launcher's C hook does the same faster);
poststop frees the allocation of this runc root's container once runc has
removed it (idempotent). Driver libraries are found through the
bind mounts and LD_LIBRARY_PATH the runtime set, so no step runs inside the
container's root here.
"""
from __future__ import annotations

import json
import sys

STAGES = ("createRuntime", "poststop")
OPTIONS = ("--state-dir", "--runc-root", "--rootfs", "--etc", "--libvgpu")
CHECK = ("rootfs", "etc", "libvgpu")


def _fail(message: str) -> int:
    sys.stderr.write(f"hami-hook: {message}\n")
    return 1


def parse_args(argv):
    options, stage, i = {}, None, 0
    while i < len(argv):
        arg = argv[i]
        if arg in OPTIONS and i + 1 < len(argv):
            options[arg[2:]] = argv[i + 1]
            i += 2
            continue
        if arg in STAGES and stage is None:
            stage = arg
        else:
            raise ValueError(f"argument={arg!r}: not understood")
        i += 1
    if stage is None or "state-dir" not in options:
        raise ValueError("usage: hami-hook --state-dir DIR --runc-root DIR [--rootfs ROOT --etc "
                         "bind|dir|mount --libvgpu PATH] createRuntime|poststop")
    given = [k for k in CHECK if k in options]
    if given and len(given) != len(CHECK):
        raise ValueError("usage: --rootfs, --etc and --libvgpu go together")
    if given and options["etc"] not in ("bind", "dir", "mount"):
        raise ValueError(f"--etc={options['etc']!r}: must be bind, dir or mount")
    if given and not (options["rootfs"].startswith("/") and options["libvgpu"].startswith("/")):
        raise ValueError("--rootfs and --libvgpu must be absolute paths")
    return options, stage


def check_mounts(state_dir: str, name: str, cid: str, pid: int, options: dict) -> str:
    """'' when the container's mounts hold the slice (rootfs.mounted_problem), else
    the line that refuses its create (the C hook's own words)."""
    import os
    from hami_runtime.lifecycle.spec_edit import rootfs
    from hami_runtime.lifecycle.node_state import state_layout
    private = state_layout.private_dir(state_dir, name)
    for path in (os.path.dirname(private), private):
        if not os.path.isdir(path) or os.path.islink(path):
            found = "absent" if not os.path.lexists(path) else "not a real directory (a symlink is refused)"
            return (f"container {cid}: {path}: {found}: no allocation to check its mounts against; "
                    "the create is refused")
    if pid <= 0:
        return f"container {cid}: the OCI state has no pid: its mounts cannot be checked; the create is refused"
    problem = rootfs.mounted_problem(pid, options["rootfs"], options["etc"], state_dir, name,
                                     options["libvgpu"])
    return f"container {cid}: {problem}; the create is refused" if problem else ""


def main(argv=None) -> int:
    from hami_runtime.lifecycle.node_state import state_layout, store
    from hami_runtime.errors import HamiError
    from hami_runtime.ids import check_container_id

    try:
        options, stage = parse_args(list(sys.argv[1:] if argv is None else argv))
    except ValueError as exc:
        return _fail(str(exc))
    try:
        state = json.load(sys.stdin)
        cid = check_container_id(state.get("id"))
    except ValueError as exc:
        return _fail(f"stdin: not an OCI state document: {exc}")
    except (HamiError, AttributeError) as exc:
        return _fail(str(exc))
    if "runc-root" not in options:
        return _fail("--runc-root: needed (an allocation belongs to a runc root and an id)")
    try:
        if stage == "createRuntime":
            name = state_layout.alloc_name(options["runc-root"], cid)
            pid = state.get("pid") or 0
            if not isinstance(pid, int) or isinstance(pid, bool):
                return _fail(f"stdin: not an OCI state document: pid={pid!r}")
            problem = check_mounts(options["state-dir"], name, cid, pid, options) if "rootfs" in options else ""
            if problem:
                return _fail(problem)
            state_layout.record_host_pid(options["state-dir"], name, pid)
        else:
            store.release(options["state-dir"], options["runc-root"], cid)
    except (HamiError, OSError) as exc:
        return _fail(f"{stage} {cid}: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
