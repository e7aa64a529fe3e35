"""The names a GPU request is written with (light: no pydantic), so that a
spec without any of them passes through without loading the request model."""
from __future__ import annotations

from collections.abc import Iterable


PREFIXES = ("hami.io/", "nvidia.com/")
KEYS = ("gpu", "gpumem", "gpumem-percentage", "gpucores", "gpu-uuid", "nouse-gpu-uuid",
        "use-gputype", "nouse-gputype", "core-policy", "priority", "oversubscribe",
        "vgpu-devices-allocated", "containers")
# A key for one container of a pod: <container name>.hami.io/<key> (pod_requests.py).
CONTAINER_DOMAIN = ".hami.io"
CONTAINER_KEYS = tuple(k for k in KEYS if k not in ("vgpu-devices-allocated", "containers"))
# Keys that ask for a GPU by themselves (gpu-uuid: that GPU); the others only
# shape a request, and alone leave a container untouched.
REQUEST_KEYS = ("gpu", "gpumem", "gpumem-percentage", "gpucores", "gpu-uuid",
                "vgpu-devices-allocated")
ENV_KEYS = ("HAMI_GPUMEM", "HAMI_GPUCORES", "HAMI_GPUMEM_PERCENTAGE")
VISIBLE = "NVIDIA_VISIBLE_DEVICES"
# CDI device names written as annotations (a device plugin's): nvidia.com/gpu=... ask for GPUs.
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
# A pod's sandbox (pause) container carries the pod annotations too (containerd's
# pod_annotations, CRI-O); it runs no GPU work and must hold no allocation.
SANDBOX_MARKERS = (("io.kubernetes.cri.container-type", "sandbox"),
                   ("io.kubernetes.cri-o.ContainerType", "sandbox"))


def is_pod_sandbox(annotations: dict[str, str]) -> bool:
    return any((annotations or {}).get(key) == value for key, value in SANDBOX_MARKERS)


def split_key(key: str):
    """(container, short key) of a request key: container None for hami.io/<key> and
    nvidia.com/<key>, the name's text for <name>.hami.io/<key> (checked by the pod's
    rules); None for any other annotation."""
    prefix, slash, short = key.partition("/") if isinstance(key, str) else ("", "", "")
    if not slash:
        return None
    if prefix in ("hami.io", "nvidia.com"):
        return (None, short) if short in KEYS else None
    if prefix.endswith(CONTAINER_DOMAIN) and short in CONTAINER_KEYS:
        return prefix[:-len(CONTAINER_DOMAIN)], short
    return None


# What else is written under hami.io/: this runtime's own record of an allocation,
# and what HAMi's scheduler, webhook and device plugins put on a pod (or a node).
OTHER_HAMI_KEYS = ("allocation", "vgpu-node", "vgpu-time", "bind-time", "bind-phase",
                   "mutex.lock", "resource-pool", "gpu-scheduler-policy", "node-scheduler-policy")
OTHER_HAMI_SUFFIXES = ("-devices-to-allocate", "-devices-allocated")  # one pair per vendor
OTHER_HAMI_PREFIXES = ("node-",)  # node annotations: handshakes and registrations


def unknown_key(annotations: dict[str, str]) -> tuple[str, str] | None:
    """(key, the nearest known key) for the first hami.io/ or <name>.hami.io/ key
    that is neither a request key nor one HAMi writes: a misspelt request would
    otherwise be a container without the slice it asked for."""
    for key in sorted(annotations or {}):
        prefix, slash, short = key.partition("/") if isinstance(key, str) else ("", "", "")
        own = prefix == "hami.io"
        if not slash or not (own or prefix.endswith(CONTAINER_DOMAIN)) or split_key(key):
            continue
        if own and (short in OTHER_HAMI_KEYS or short.endswith(OTHER_HAMI_SUFFIXES)
                    or short.startswith(OTHER_HAMI_PREFIXES)):
            continue
        import difflib  # only for the refusal
        known = KEYS if own else CONTAINER_KEYS
        nearest = (difflib.get_close_matches(short, known, n=1, cutoff=0) or known[:1])[0]
        return key, f"{prefix}/{nearest}"
    return None


def is_cdi_key(key) -> bool:
    return isinstance(key, str) and key.startswith(CDI_ANNOTATION_PREFIX)


def mentions_request(annotations: dict[str, str], env: Iterable[str], env_requests: bool) -> bool:
    """False only when no request key is present at all (a cheap superset test),
    or for a pod's sandbox container."""
    if is_pod_sandbox(annotations):
        return False
    if any(split_key(key) or is_cdi_key(key) for key in annotations or {}):
        return True
    if env_requests:
        names = (VISIBLE,) + ENV_KEYS
        return any(isinstance(e, str) and e.partition("=")[0] in names for e in env or ())
    return False


def mentioned_keys(annotations: dict[str, str], env: Iterable[str], env_requests: bool) -> list:
    """The request keys present (for the log line of a container that asks for nothing)."""
    found = [k for k in sorted(annotations or {}) if split_key(k) or is_cdi_key(k)]
    if env_requests:
        names = (VISIBLE,) + ENV_KEYS
        found += [e for e in env or () if isinstance(e, str) and e.partition("=")[0] in names]
    return found
