"""Whole-string checks of the names and numbers the runtime reads from specs,
annotations and state files: each value must match its pattern entirely."""
from __future__ import annotations

import re
from collections.abc import Callable


def _whole(pattern: str) -> Callable[[str], bool]:
    """Compiled at import, so that the create server's children inherit it
    compiled rather than each compiling it again."""
    match = re.compile(pattern).fullmatch
    return lambda value: match(value) is not None


container_id = _whole(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,1023}")  # runc's own rule
gpu_uuid = _whole(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,94}")
env_name = _whole(r"[A-Za-z_][A-Za-z0-9_]*")
number = _whole(r"[0-9]{1,10}")
root_key = _whole(r"[0-9a-f]{16}")
dns_label = _whole(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")  # a Kubernetes container name


def mig_uuid(value: str) -> bool:
    """A MIG instance's UUID, as NVML writes it (MIG-<uuid>)."""
    return gpu_uuid(value) and value[:4].upper() == "MIG-"


def dns_subdomain(value: str) -> bool:
    """Dot-separated labels, at most 253 characters (pod names)."""
    return 0 < len(value) <= 253 and all(dns_label(part) for part in value.split("."))
