"""The caches a GPU create reads, filled ahead of it.

The create server runs this (in a child) as it starts. With the server off
(create_server_idle_s = 0), the launcher starts it, detached, from the first
create on a state dir that holds no validated config (a fresh /run after a
boot) when that create asks for no GPU and so starts no Python itself. Either
way a pod's sandbox container comes before its GPU containers, which then find
the config validated and the GPUs and driver files discovered, as any later
create does. It writes nothing but
those caches, and a failure here is no one's error: the create that needs them
does the same work and reports what it finds.
"""
from __future__ import annotations

from ... import config


def warm_up() -> int:
    try:
        cfg = config.load()
        from ...node import discovery_cache
        with discovery_cache.gpus_beside(cfg) as gpus:
            discovery_cache.driver_files(cfg)
            gpus()
    except Exception:  # the create that needs them reports it
        return 1
    return 0
