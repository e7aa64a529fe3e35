"""A container's GPU request, from its annotations or (for engines without
annotations) its env. Pure: strings in, a validated model out, or a refusal
that names the key and the value."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import NamedTuple

from ...errors import HamiError
from ...names import gpu_uuid, number as digits
from ...policies import CORE_POLICIES
from . import device_names
from .request_keys import CONTAINER_DOMAIN, CONTAINER_KEYS, ENV_KEYS, REQUEST_KEYS, is_cdi_key, split_key

MAX_GPUS = 16
MAX_DECISION_ENTRIES = 256  # containers of one pod in a scheduler decision


class AssignedDevice(NamedTuple):
    uuid: str
    mem_mib: int
    cores: int


def _bounded(name: str, value, low: int, high: int, optional: bool = True):
    if value is None and optional:
        return value
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"GpuRequest {name}={value!r}: not in {low}..{high}")
    return value


class GpuRequest(NamedTuple):
    """A validated request (read-only; made by `request`, which checks every
    value again after the parser has)."""
    source: str                      # "annotations" or "env"
    count: int | None = 1            # None: every GPU
    mem_mib: int | None = None
    mem_percentage: int | None = None
    cores: int | None = None
    use_uuids: tuple = ()
    avoid_uuids: tuple = ()
    use_indices: tuple = ()
    use_mig_indices: tuple = ()      # MIG instances by GPU:MIG index, "0:1"
    use_types: tuple = ()
    avoid_types: tuple = ()
    core_policy: str = "default"
    priority: int = 1
    oversubscribe: bool = True       # False: never spill to host memory
    assigned: tuple = ()
    keys: Mapping[str, str] = MappingProxyType({})  # the request as written

    def key_for(self, short: str) -> str:
        """The key this request wrote `short` under (hami.io/ or nvidia.com/)."""
        return next((k for k in self.keys if k.partition("/")[2] == short), f"hami.io/{short}")

    def naming_key(self) -> str:
        """The key that named its devices."""
        if self.source == "env":
            return "NVIDIA_VISIBLE_DEVICES"
        return next((k for k in self.keys if is_cdi_key(k)), self.key_for("gpu-uuid"))

    def describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.keys.items()) or self.source

    def pinned_to(self, uuids) -> "GpuRequest | None":
        """The same request on exactly these GPUs (a restarted container's), None
        where it could not have been granted them (another count, or GPUs its
        own gpu-uuid list leaves out)."""
        uuids = tuple(uuids)
        if self.assigned or self.count != len(uuids) or (
                self.use_uuids and not set(uuids) <= set(self.use_uuids)):
            return None
        return self._replace(use_uuids=uuids)


def request(**values) -> GpuRequest:
    """A GpuRequest of these values, each checked."""
    made = GpuRequest(**values)
    if made.source not in ("annotations", "env"):
        raise ValueError(f"GpuRequest source={made.source!r}")
    if made.core_policy not in CORE_POLICIES:
        raise ValueError(f"GpuRequest core_policy={made.core_policy!r}")
    if not isinstance(made.oversubscribe, bool):
        raise ValueError(f"GpuRequest oversubscribe={made.oversubscribe!r}")
    _bounded("count", made.count, 1, MAX_GPUS)
    _bounded("mem_mib", made.mem_mib, 1, 1 << 30)
    _bounded("mem_percentage", made.mem_percentage, 1, 100)
    _bounded("cores", made.cores, 0, 100)
    _bounded("priority", made.priority, 0, 1, optional=False)
    return made._replace(**{name: tuple(getattr(made, name)) for name in
                            ("use_uuids", "avoid_uuids", "use_indices", "use_mig_indices", "use_types",
                             "avoid_types", "assigned")}, keys=dict(made.keys))


def number(key: str, value: str, low: int, high: int) -> int:
    """Plain ASCII digits and nothing else ("100\n" and " 100" are refused)."""
    if isinstance(value, str) and value.startswith("-") and digits(value[1:]):
        raise HamiError(key, value, f"negative: must be in {low}..{high}")
    if not isinstance(value, str) or not digits(value):
        raise HamiError(key, value, "not a whole number (ASCII digits only)")
    result = int(value)
    if not low <= result <= high:
        raise HamiError(key, value, f"out of range {low}..{high}")
    return result


def _items(value: str):
    """A comma list; spaces around items are allowed, other white space is not."""
    return tuple(item.strip(" ") for item in value.split(",") if item.strip(" "))


def uuid_list(key: str, value: str) -> tuple[str, ...]:
    items = _items(value)
    if not items:
        raise HamiError(key, value, "empty list of UUIDs")
    for item in items:
        if not gpu_uuid(item):
            raise HamiError(key, value, f"not a GPU UUID: {item!r}")
    return items


def type_list(key: str, value: str) -> tuple[str, ...]:
    items = tuple(item.lower() for item in _items(value))
    if not items:
        raise HamiError(key, value, "empty list of GPU types")
    for item in items:
        if not item.isprintable():
            raise HamiError(key, value, f"not a GPU type: {item!r}")
    return items


def _entry_devices(key: str, value: str, text: str) -> tuple[AssignedDevice, ...]:
    devices = []
    for entry in (e for e in text.split(":") if e):
        parts = entry.split(",")
        if len(parts) != 4:
            raise HamiError(key, value, f"device entry {entry!r} is not UUID,NVIDIA,<MiB>,<cores>")
        uuid, vendor, mem, cores = parts
        if not gpu_uuid(uuid):
            raise HamiError(key, value, f"not a GPU UUID: {uuid!r}")
        if vendor != "NVIDIA":
            raise HamiError(key, value, f"device vendor {vendor!r} is not NVIDIA")
        devices.append(AssignedDevice(uuid=uuid, mem_mib=number(key, mem, 1, 1 << 30),
                                      cores=number(key, cores, 0, 100)))
    if len({d.uuid for d in devices}) != len(devices):
        raise HamiError(key, value, "the same GPU twice in one container entry")
    return tuple(devices)


def decision_entries(key: str, value: str) -> tuple[tuple[AssignedDevice, ...], ...]:
    """HAMi's decision: one entry per container it counts (init containers first,
    then the pod's containers, in the pod's order), each 'UUID,NVIDIA,<MiB>,<cores>:'
    per device and ended by ';'; a container without a GPU has an empty entry."""
    containers = value.split(";")
    if containers[-1] == "":
        containers.pop()
    if len(containers) > MAX_DECISION_ENTRIES:
        raise HamiError(key, value, f"more than {MAX_DECISION_ENTRIES} container entries")
    entries = tuple(_entry_devices(key, value, text) for text in containers)
    if not any(entries):
        raise HamiError(key, value, "no device for any container")
    return entries


def collect(annotations: dict[str, str], container: str | None = None) -> dict[str, tuple[str, str]]:
    """short key -> (full key, value); hami.io/ and nvidia.com/ spellings must agree.
    With `container`, that container's own keys (<container>.hami.io/<key>) win over
    the pod's."""
    found: dict[str, tuple[str, str]] = {}
    for key in sorted(annotations):
        split = split_key(key)
        if split is None or split[0] is not None:
            continue
        short, value = split[1], annotations[key]
        if not isinstance(value, str):
            raise HamiError(key, repr(value), "annotation value must be a string")
        if short in found and found[short][1] != value:
            other = found[short][0]
            raise HamiError(key, value, f"conflicts with {other}={found[short][1]}")
        found.setdefault(short, (key, value))
    if container is not None:
        for short in CONTAINER_KEYS:
            key = f"{container}{CONTAINER_DOMAIN}/{short}"
            if key in annotations:
                if not isinstance(annotations[key], str):
                    raise HamiError(key, repr(annotations[key]), "annotation value must be a string")
                found[short] = (key, annotations[key])
    return found


def from_annotations(annotations: dict[str, str], core_policy: str = "default",
                     container: str | None = None, entry: int | None = None) -> GpuRequest | None:
    """`container`: the pod's container this is (its own keys count); `entry`: which
    of a scheduler decision's container entries is its (pod_requests.py decides);
    without one, a decision must hold a single entry."""
    found = collect(annotations or {}, container)
    cdi = cdi_devices(annotations or {})
    if not any(k in found for k in REQUEST_KEYS) and cdi is None:
        return None
    args: dict = {"source": "annotations", "keys": {k: v for k, v in found.values()},
                  "core_policy": core_policy}
    if cdi is not None:
        args.update(_cdi_args(found, *cdi))
    get = found.get
    if "gpumem" in found and "gpumem-percentage" in found:
        key, value = found["gpumem-percentage"]
        raise HamiError(key, value, f"conflicts with {found['gpumem'][0]}={found['gpumem'][1]}: "
                        "give memory in MiB or in percent, not both")
    if get("gpu"):
        args["count"] = number(*found["gpu"], 1, MAX_GPUS)
    if get("gpumem"):
        args["mem_mib"] = number(*found["gpumem"], 1, 1 << 30)
    if get("gpumem-percentage"):
        args["mem_percentage"] = number(*found["gpumem-percentage"], 1, 100)
    if get("gpucores"):
        args["cores"] = number(*found["gpucores"], 0, 100)
    if get("gpu-uuid"):
        args["use_uuids"] = uuid_list(*found["gpu-uuid"])
    if get("nouse-gpu-uuid"):
        args["avoid_uuids"] = uuid_list(*found["nouse-gpu-uuid"])
        both = set(args["avoid_uuids"]) & set(args.get("use_uuids", ()))
        if both:
            key, value = found["nouse-gpu-uuid"]
            raise HamiError(key, value, f"conflicts with {found['gpu-uuid'][0]}: "
                            f"{sorted(both)[0]} is both used and avoided")
    if get("use-gputype"):
        args["use_types"] = type_list(*found["use-gputype"])
    if get("nouse-gputype"):
        args["avoid_types"] = type_list(*found["nouse-gputype"])
    if get("core-policy"):
        key, value = found["core-policy"]
        if value not in CORE_POLICIES:
            raise HamiError(key, value, "must be default, force or disable")
        args["core_policy"] = value
    if get("priority"):
        args["priority"] = number(*found["priority"], 0, 1)
    if "oversubscribe" in found:
        key, value = found["oversubscribe"]
        if value not in ("true", "false"):
            raise HamiError(key, value, "must be true or false")
        args["oversubscribe"] = value == "true"
    if get("vgpu-devices-allocated"):
        key, value = found["vgpu-devices-allocated"]
        entries = decision_entries(key, value)
        if entry is None and len(entries) != 1:
            raise HamiError(key, value, f"{len(entries)} container entries: cannot tell which one is "
                            "this container, which is not in a Kubernetes pod (no "
                            "io.kubernetes.cri.container-name or io.kubernetes.container.name)")
        args["assigned"] = entries[entry or 0]
        if not args["assigned"]:
            raise HamiError(key, value, f"entry {(entry or 0) + 1} has no device")
        if "count" in args and args["count"] != len(args["assigned"]):
            gkey, gvalue = found["gpu"]
            raise HamiError(gkey, gvalue, f"conflicts with {key}, which assigns "
                            f"{len(args['assigned'])} GPU(s)")
        args["count"] = len(args["assigned"])
    return request(**args)


def cdi_devices(annotations: dict[str, str]) -> tuple[str, str, device_names.Named] | None:
    """The GPUs named by CDI annotations (cdi.k8s.io/<name>: a comma list of CDI
    device names, as a device plugin writes them): (key, value, names) of the
    first that names any, None where none does. Another vendor's devices are
    not ours: the engine serves them."""
    found = None
    for key in sorted(k for k in annotations if is_cdi_key(k)):
        value = annotations[key]
        if not isinstance(value, str):
            raise HamiError(key, repr(value), "annotation value must be a string")
        ours = [item for item in _items(value) if device_names.is_cdi(item)]
        if not ours:
            continue
        if found is not None:
            raise HamiError(key, value, f"names GPUs, and so does {found[0]}: name them in one annotation")
        found = (key, value, device_names.parse(key, value, ours, MAX_GPUS))
    return found


def _cdi_args(found: dict[str, tuple[str, str]], key: str, value: str,
              named: device_names.Named) -> dict:
    for other in ("gpu-uuid", "vgpu-devices-allocated"):
        if other in found:
            raise HamiError(key, value, f"conflicts with {found[other][0]}: the GPUs are named twice")
    if "gpu" in found and number(*found["gpu"], 1, MAX_GPUS) != named.count:
        raise HamiError(*found["gpu"], f"conflicts with {key}, which names {named.count or 'all'} GPU(s)")
    return {"keys": {**{k: v for k, v in found.values()}, key: value}, **_named_args(named)}


def _named_args(named: device_names.Named) -> dict:
    return {"count": named.count, "use_indices": named.indices,
            "use_mig_indices": named.mig_indices, "use_uuids": named.uuids}


def env_map(env: Iterable[str]) -> dict[str, str]:
    """The env as NVIDIA's runtime reads it: of a name given twice, the last
    (dockerd appends --gpus's NVIDIA_VISIBLE_DEVICES after the image's)."""
    result: dict[str, str] = {}
    for item in env or ():
        name, eq, value = item.partition("=")
        if eq:
            result[name] = value
    return result


def from_env(env: dict[str, str], core_policy: str = "default") -> GpuRequest | None:
    visible = env.get("NVIDIA_VISIBLE_DEVICES")
    has_limits = any(k in env for k in ENV_KEYS)
    if visible is None and not has_limits:
        return None
    args: dict = {"source": "env", "core_policy": core_policy,
                  "keys": {k: env[k] for k in ("NVIDIA_VISIBLE_DEVICES",) + ENV_KEYS if k in env}}
    text = (visible or "").strip(" ")
    if visible is not None and text.lower() in ("none", "void", ""):
        if has_limits:
            name = next(k for k in ENV_KEYS if k in env)
            raise HamiError(name, env[name], f"conflicts with NVIDIA_VISIBLE_DEVICES={visible}")
        return None
    if text:
        args.update(_named_args(device_names.parse("NVIDIA_VISIBLE_DEVICES", visible, _items(text), MAX_GPUS)))
    if "HAMI_GPUMEM" in env and "HAMI_GPUMEM_PERCENTAGE" in env:
        raise HamiError("HAMI_GPUMEM_PERCENTAGE", env["HAMI_GPUMEM_PERCENTAGE"],
                        f"conflicts with HAMI_GPUMEM={env['HAMI_GPUMEM']}")
    if "HAMI_GPUMEM" in env:
        args["mem_mib"] = number("HAMI_GPUMEM", env["HAMI_GPUMEM"], 1, 1 << 30)
    if "HAMI_GPUMEM_PERCENTAGE" in env:
        args["mem_percentage"] = number("HAMI_GPUMEM_PERCENTAGE", env["HAMI_GPUMEM_PERCENTAGE"], 1, 100)
    if "HAMI_GPUCORES" in env:
        args["cores"] = number("HAMI_GPUCORES", env["HAMI_GPUCORES"], 0, 100)
    return request(**args)


def for_visible_devices_alone(asked: GpuRequest | None, policy: str, split_count: int,
                              default_memory_mib: int) -> GpuRequest | None:
    """What an env request that names GPUs and no size gets (a stock CUDA image's
    NVIDIA_VISIBLE_DEVICES=all, `docker run --gpus`): the node's
    visible_devices_alone says. `slice`: the node's default size, or where that
    is the whole card a split_count-th of it; `whole`: whole cards; `none`: no
    GPU (None). Any other request as it is."""
    if asked is None or asked.source != "env" or any(k in asked.keys for k in ENV_KEYS):
        return asked
    if policy == "none":
        return None
    if policy == "whole" or default_memory_mib:
        return asked
    return asked._replace(mem_percentage=max(1, 100 // split_count))


def parse(annotations: dict[str, str], env: Iterable[str], env_requests: bool = True,
          core_policy: str = "default", container: str | None = None) -> GpuRequest | None:
    """Annotations win; env is read only when the operator allows env requests.
    `core_policy` is the node's, for a request that names none; `container`: the
    pod's container this is, whose own keys count."""
    request = from_annotations(annotations or {}, core_policy, container)
    if request is not None or not env_requests:
        return request
    return from_env(env_map(env), core_policy)
