"""hami-hook: the OCI hook hami-runtime puts into GPU containers.

  hami-hook --state-dir DIR --runc-root DIR createRuntime|poststop  < OCI state

createRuntime records the container's host PID beside its allocation
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


def _fail(message: str) -> int:
    sys.stderr.write(f"hami-hook: {message}\n")
    return 1


def parse_args(argv):
    options, stage, i = {}, None, 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--state-dir", "--runc-root") and i + 1 < len(argv):
            options[arg[2:]] = argv[i + 1]
            i += 2
            continue
        if arg in STAGES and stage is None:
            stage = arg
        else:
            raise ValueError(f"argument={arg!r}: not understood")
        i += 1
    if stage is None or "state-dir" not in options:
        raise ValueError("usage: hami-hook --state-dir DIR --runc-root DIR createRuntime|poststop")
    return options, stage


def main(argv=None) -> int:
    from hami_runtime.lifecycle import state_layout, store
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
            state_layout.record_host_pid(options["state-dir"], name, int(state.get("pid") or 0))
        else:
            store.release(options["state-dir"], options["runc-root"], cid)
    except (HamiError, OSError) as exc:
        return _fail(f"{stage} {cid}: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
