"""The node config as a model: every key with its type, bounds and default.

config.load validates a config file through it only when the file is not the
one validated last time (the validated values are kept in the state dir's
cache, keyed by the file's identity and this module's), so a create with an
unchanged config never imports pydantic. `python -m hami_runtime.config_model`
writes the JSON Schema (schemas/config.schema.json) made from the model.
"""
from __future__ import annotations

import json
import os
import re
import sys
from typing import Annotated, Literal, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from . import config_cache, installed
from .errors import HamiError
from .policies import CORE_POLICIES

DEFAULT_RUNTIMES = ["/usr/bin/runc", "/usr/sbin/runc", "/usr/local/bin/runc", "/usr/local/sbin/runc"]
SCHEMA_ID = "https://hami.io/schemas/config.schema.json"


def _absolute(value: str) -> str:
    if not os.path.isabs(value):
        raise ValueError("must be an absolute path")
    return os.path.normpath(value)


def _absolute_or_empty(value: str) -> str:
    return value and _absolute(value)


AbsolutePath = Annotated[str, Field(pattern="^/"), AfterValidator(_absolute)]
AbsolutePathOrEmpty = Annotated[str, Field(pattern="^(/.*)?$"), AfterValidator(_absolute_or_empty)]
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ExtraMount(Strict):
    source: AbsolutePath
    destination: AbsolutePath
    readonly: bool = False


class NodeConfig(Strict):
    """hami-runtime node config (/etc/hami/config.toml, as data)."""
    model_config = ConfigDict(title="hami-runtime node config (/etc/hami/config.toml, as data)")

    runtime: Union[AbsolutePath, Annotated[list[AbsolutePath], Field(min_length=1)]] = Field(
        default_factory=lambda: list(DEFAULT_RUNTIMES),
        description="the real OCI runtime: a path or candidates; the first executable one is used")
    state_dir: AbsolutePath = Field(
        config_cache.DEFAULT_STATE_DIR, description="allocator state, container dirs, boards, caches")
    libvgpu: AbsolutePath = Field(
        default_factory=lambda: installed.LIBVGPU,
        description="libvgpu.so bind-mounted into GPU containers (default: this install's)")
    split_count: int = Field(10, ge=1, le=1024, description="containers that may share one GPU")
    memory_scaling: float = Field(
        1.0, gt=0, le=100, description="allocatable memory = card memory x this; above 1, what the "
        "card cannot hold spills to host memory (unless a container sets hami.io/oversubscribe: false)")
    default_memory_mib: int = Field(0, ge=0, le=1 << 30,
                                    description="memory per vGPU when a request names none; 0: the whole card")
    default_cores: int = Field(0, ge=0, le=100, description="SM share when a request names none; 0: no limit")
    core_policy: Literal[CORE_POLICIES] = Field(
        "default", description="SM policy when a request names none (hami.io/core-policy)")
    priority_idle_ms: int = Field(200, ge=1, le=60000, description="high-priority work idle this long: "
                                  "low-priority launches resume")
    policy: Literal["binpack", "spread"] = Field("binpack", description="which GPU a request goes to")
    driver_root: AbsolutePath = Field("/", description="where the driver's files are (its etc/ld.so.cache)")
    dev_root: AbsolutePath = Field("/dev", description="host device nodes")
    proc_devices: AbsolutePath = Field("/proc/devices", description="device majors")
    mig_minors: AbsolutePath = Field("/proc/driver/nvidia-caps/mig-minors",
                                     description="the minors of the nvidia-caps nodes that give access to MIG instances")
    nvml_library: AbsolutePathOrEmpty = Field("", description="an explicit libnvidia-ml.so.1; empty: the loader's")
    env_requests: bool = Field(True, description="accept env requests (NVIDIA_VISIBLE_DEVICES, HAMI_GPUMEM, ...)")
    visible_devices_alone: Literal["slice", "whole", "none"] = Field(
        "slice", description="what NVIDIA_VISIBLE_DEVICES with no size (a stock CUDA image, docker "
        "--gpus) gets on each GPU: the default slice (default_memory_mib, or 1/split_count of the card), "
        "whole cards, or no GPU")
    log_file: AbsolutePathOrEmpty = Field("", description="the runtime's own log; empty: none")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    extra_env: dict[EnvName, str] = Field(default_factory=dict, description="env set in every GPU container")
    extra_mounts: list[ExtraMount] = Field(default_factory=list,
                                           description="bind mounts into every GPU container")
    allow_chroot: bool = Field(
        False, description="GPU containers keep CAP_SYS_CHROOT; false (the default): it is taken from "
        "every capability set, as a chroot into a tree without /etc/ld.so.preload runs unlimited")
    allow_user_namespaces: bool = Field(
        False, description="GPU containers may make new namespaces as the engine's seccomp profile "
        "lets them; false (the default): seccomp rules the runtime adds refuse unshare and clone with a "
        "namespace flag, setns, and clone3 (ENOSYS), as in a user namespace of its own a container can "
        "unmount or cover /etc/ld.so.preload and run unlimited")
    allow_sys_admin: bool = Field(
        False, description="GPU containers may hold CAP_SYS_ADMIN (privileged ones do); false (the "
        "default): such a create is refused, as with it a container can unmount or cover "
        "/etc/ld.so.preload and run unlimited")
    create_server_idle_s: int = Field(
        300, ge=0, le=86400, description="a GPU create through the launcher is served by a Python that "
        "has loaded the runtime already (the create server), which ends after this many seconds without "
        "a create while no GPU container lives, and the next create starts it again; 0: none, every GPU "
        "create starts its own Python")
    agent_interval_ms: int = Field(
        250, ge=50, le=10000, description="the node agent (hamictl agent) reads each GPU container's "
        "processes from its cgroup and the driver's per-process memory and SM use this often")
    memory_enforcement: Literal["kill", "log", "off"] = Field(
        "kill", description="what the node agent does about a container that holds more device memory than "
        "its slice, by the driver's count over its cgroup's processes, for longer than memory_grace_ms: "
        "kill its processes that hold memory, newest first (its first process last), until it fits; log "
        "it; or off (the figures only)")
    memory_grace_ms: int = Field(
        1000, ge=0, le=600000, description="how long a container may hold more than its slice before "
        "memory_enforcement acts")
    sm_enforcement: Literal["freeze", "log", "off"] = Field(
        "log", description="what the node agent does about a container whose processes use more of the "
        "SMs than its share (the driver's per-process utilisation over the last second) by more than "
        "sm_tolerance_pct for longer than sm_grace_ms: freeze its cgroup for the time it took beyond its "
        "share (at most 5 s), log it, or off (the figures only)")
    sm_grace_ms: int = Field(
        5000, ge=0, le=600000, description="how long a container may use more than its SM share before "
        "sm_enforcement acts")
    sm_tolerance_pct: int = Field(
        10, ge=0, le=100, description="SM use above the share by at most this many points is not an excess")
    hook_command: list[str] = Field(
        default_factory=list, description="argv of the OCI hook, absolute path first; empty: the "
        "launcher's own createRuntime hook, and this Python's hami_hook")

    @field_validator("runtime")
    @classmethod
    def _as_list(cls, value):
        return [value] if isinstance(value, str) else value

    @field_validator("hook_command")
    @classmethod
    def _absolute_program(cls, value):
        if not value:
            raise ValueError("must be a non-empty list of strings")
        _absolute(value[0])
        return value


# what pydantic adds to a location beside the keys: the union branch or check tried
_TAG = re.compile(r"str|int|float|bool|\[key\]|(list|dict|function-\w+)\[.*")


def _where(loc: tuple) -> str:
    """pydantic's location of an error as the config writes it: extra_mounts[0].source."""
    parts = [p for p in loc if not (isinstance(p, str) and _TAG.fullmatch(p))]
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def validate(raw: dict, path: str = "") -> dict:
    """The config's values (every key, defaults filled in), or a HamiError naming
    the first bad key, its value and the file."""
    try:
        values = NodeConfig.model_validate(raw).model_dump()
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        # of a union's errors, the one of the branch the value's type chose
        same_key = [e for e in errors if e["loc"][:1] == errors[0]["loc"][:1]]
        error = next((e for e in same_key if not e["type"].endswith("_type")), same_key[0])
        where = _where(error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown key"
        elif isinstance(error["input"], str) and error["type"].endswith(("_parsing", "_type")):
            message += " (it is given as a string, in quotes)"
        raise HamiError(f"config {where}", error["input"], f"{message} (in {path or 'config'})") from None
    return values


def schema() -> dict:
    document = NodeConfig.model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID, **document}


def main(argv=None) -> int:
    """Write the JSON Schema to the file named, or print it."""
    argv = sys.argv[1:] if argv is None else argv
    text = json.dumps(schema(), indent=2, sort_keys=True) + "\n"
    if argv:
        with open(argv[0], "w", encoding="utf-8") as handle:
            handle.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
