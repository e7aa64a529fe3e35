"""delete: run runc's delete, then free the allocation if its container is gone.

Through the launcher, runc's delete has run already (HAMI_DELETE_DONE, set
for the detached release the launcher starts after it): only the release is
left. The release can free nothing that lives, so the variable grants nothing.

The allocation is this runc root's (a delete under another root never touches
it), and it is freed only under the allocator lock and only when no container
and no create in flight holds it.
"""
from __future__ import annotations

import os

from ... import log
from ...errors import HamiError
from ...ids import check_container_id

DELETE_DONE_ENV = "HAMI_DELETE_DONE"  # hami_runtime/launcher/hook.h


def _run(argv) -> int:
    """runc with our stdio, its exit status (no subprocess module: a delete
    should cost little more than runc's own)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.execv(argv[0], argv)
        finally:
            os._exit(127)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def delete(cfg, inv, runtime: str) -> int:
    cid = check_container_id(inv.container_id)
    done = os.environ.pop(DELETE_DONE_ENV, None) == "1"
    rc = 0 if done else _run([runtime] + inv.argv)
    if rc < 0:
        rc = 128 - rc
    if os.path.isdir(cfg.state_dir) and not os.path.lexists(os.path.join(inv.root, cid)):
        from ..node_state import store
        try:
            if store.release(cfg.state_dir, inv.root, cid):
                log.write(cfg, "info", f"{cid}: released on delete ({inv.root})")
        except (HamiError, OSError) as exc:
            log.write(cfg, "error", f"{cid}: release failed: {exc}")
    return rc
