"""delete: run runc's delete, then free the allocation once the container is gone."""
from __future__ import annotations

import os
import subprocess

from . import log, store
from .errors import HamiError
from .ids import check_container_id


def delete(cfg, inv, runtime: str) -> int:
    cid = check_container_id(inv.container_id)
    # Inherit stdio (no pipes), keep runc's exit status.
    rc = subprocess.call([runtime] + inv.argv)
    if os.path.isdir(cfg.state_dir) and not os.path.isdir(os.path.join(inv.root, cid)):
        try:
            if store.release(cfg.state_dir, cid, [inv.root]):
                log.write(cfg, "info", f"{cid}: released on delete")
        except (HamiError, OSError) as exc:
            log.write(cfg, "error", f"{cid}: release failed: {exc}")
    return rc
