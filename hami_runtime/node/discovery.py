"""What the node has: GPUs through NVML, device majors from /proc/devices, the
driver's user-space files from the ld cache under the driver root."""
from __future__ import annotations

import os
from typing import NamedTuple

from .. import phases
from ..errors import HamiError
from . import driver_capabilities
from .gpu import GpuInfo

PROGRAM_DIRS = ("usr/bin", "bin", "usr/local/bin", "usr/sbin")


def program_places() -> list[str]:
    """Where the driver's programs are looked for under the driver root, by class."""
    return [f"{place}/{program}" for programs in driver_capabilities.PROGRAMS.values()
            for program in programs for place in PROGRAM_DIRS]
LDCONFIG = ("/sbin/ldconfig", "/usr/sbin/ldconfig", "/sbin/ldconfig.real")
# compiled on use: a create that finds the discovery cache loads no re
_CACHE_LINE = r"^\s*(\S+)\s+\(([^)]*)\)\s+=>\s+(\S+)\s*$"


class DriverFile(NamedTuple):
    host_path: str       # resolved, under the driver root
    container_path: str  # where the cache lists it (root removed)
    capability: str      # its NVIDIA_DRIVER_CAPABILITIES class (driver_capabilities.py)
    bits: int = 64       # 32: a library's 32-bit copy (compat32)


def load_gpus(nvml_library: str = "") -> list[GpuInfo]:
    import ctypes  # here: a create that finds the discovery cache needs neither
    import time
    started = time.monotonic_ns()
    import pynvml
    if nvml_library:
        try:
            # Loaded first and global, pynvml's own dlopen of the soname finds it.
            ctypes.CDLL(nvml_library, mode=os.RTLD_GLOBAL)
        except OSError as exc:
            raise HamiError("config nvml_library", nvml_library, f"cannot load: {exc}") from None
    loaded = time.monotonic_ns()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise HamiError("NVML", nvml_library or "libnvidia-ml.so.1", f"init failed: {exc}") from None
    initialised = time.monotonic_ns()
    phases.note(f"NVML loaded in {(loaded - started) / 1e6:.2f}ms, nvmlInit {(initialised - loaded) / 1e6:.2f}ms")
    try:
        driver = text(pynvml.nvmlSystemGetDriverVersion())
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            gpu = GpuInfo(
                index=index,
                uuid=text(pynvml.nvmlDeviceGetUUID(handle)),
                model=text(pynvml.nvmlDeviceGetName(handle)),
                memory_mib=pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1 << 20),
                minor=pynvml.nvmlDeviceGetMinorNumber(handle),
                arch="%d.%d" % pynvml.nvmlDeviceGetCudaComputeCapability(handle),
                brand=brand_name(pynvml.nvmlDeviceGetBrand(handle)),
                driver=driver,
                cuda=f"{cuda // 1000}.{cuda % 1000 // 10}")
            instances = mig_instances(pynvml, handle, gpu)
            gpus.append(gpu._replace(mig_mode=instances is not None))
            gpus.extend(instances or ())
        phases.note(f"NVML queries {phases.since_ms(initialised):.2f}ms")
        return gpus
    except pynvml.NVMLError as exc:
        raise HamiError("NVML", nvml_library or "libnvidia-ml.so.1", f"query failed: {exc}") from None
    finally:
        closing = time.monotonic_ns()
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
        phases.note(f"nvmlShutdown {phases.since_ms(closing):.2f}ms")


def text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def mig_instances(pynvml, handle, gpu: GpuInfo) -> list[GpuInfo] | None:
    """A GPU's MIG instances, None when it is not in MIG mode (or its driver
    knows no MIG)."""
    try:
        current, _ = pynvml.nvmlDeviceGetMigMode(handle)
    except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
        return None
    if current != pynvml.NVML_DEVICE_MIG_ENABLE:
        return None
    instances = []
    for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except pynvml.NVMLError_NotFound:
            continue  # an empty slot
        instances.append(gpu._replace(
            uuid=text(pynvml.nvmlDeviceGetUUID(mig)), model=text(pynvml.nvmlDeviceGetName(mig)),
            memory_mib=pynvml.nvmlDeviceGetMemoryInfo(mig).total // (1 << 20),
            parent=gpu.uuid, mig_index=slot,
            gpu_instance=pynvml.nvmlDeviceGetGpuInstanceId(mig),
            compute_instance=pynvml.nvmlDeviceGetComputeInstanceId(mig)))
    return instances


def brand_name(brand: int) -> str:
    """NVML's brand as NVIDIA_REQUIRE_BRAND names it: NVML_BRAND_TESLA "tesla",
    NVML_BRAND_NVIDIA_RTX "nvidiartx", NVML_BRAND_NVIDIA_VWS "vws"."""
    import pynvml
    for constant in sorted(n for n in dir(pynvml) if n.startswith("NVML_BRAND_")):
        if getattr(pynvml, constant) == brand and constant != "NVML_BRAND_COUNT":
            name = constant[len("NVML_BRAND_"):]
            if name.startswith("NVIDIA_") and name != "NVIDIA_RTX":
                name = name[len("NVIDIA_"):]
            return name.replace("_", "").lower()
    return "unknown"


def parse_proc_devices(text: str) -> dict[str, int]:
    """Character device majors by name."""
    majors: dict[str, int] = {}
    in_char = False
    for line in text.splitlines():
        if line.strip().endswith("devices:"):
            in_char = line.strip().startswith("Character")
            continue
        parts = line.split()
        if in_char and len(parts) == 2 and parts[0].isdigit():
            majors.setdefault(parts[1], int(parts[0]))
    return majors


def read_majors(path: str) -> dict[str, int]:
    try:
        with open(path, encoding="utf-8") as handle:
            return parse_proc_devices(handle.read())
    except OSError as exc:
        raise HamiError("config proc_devices", path, f"cannot read: {exc.strerror}") from None


def parse_ld_cache(output: str) -> list[tuple[str, str, str]]:
    """`ldconfig -p` lines -> (soname, flags, path)."""
    import re
    entries = []
    for line in output.splitlines():
        match = re.match(_CACHE_LINE, line)
        if match:
            entries.append(match.groups())
    return entries


def select_driver_libs(entries, root: str) -> list[DriverFile]:
    """The driver's libraries in the cache (64- and 32-bit), mapped to files under the root."""
    chosen: dict[str, DriverFile] = {}
    real_root = os.path.realpath(root)
    for soname, flags, path in entries:
        capability = driver_capabilities.library_class(soname)
        if capability is None or not os.path.isabs(path) or path in chosen:
            continue  # not the driver's (the toolkit's libcudart is not)
        host = os.path.realpath(os.path.join(root, path.lstrip("/")))
        if not (host == real_root or host.startswith(real_root.rstrip("/") + "/")):
            continue  # a link that leaves the driver root
        if os.path.isfile(host):
            chosen[path] = DriverFile(host, path, capability, 64 if "64" in flags else 32)
    return list(chosen.values())


def driver_files(root: str) -> list[DriverFile]:
    cache = os.path.join(root, "etc", "ld.so.cache")
    ldconfig = next((p for p in LDCONFIG if os.access(p, os.X_OK)), None)
    if ldconfig is None:
        raise HamiError("ldconfig", ",".join(LDCONFIG), "not found")
    if not os.path.isfile(cache):
        raise HamiError("config driver_root", root, f"no ld cache at {cache}")
    import subprocess  # only when the discovery cache misses
    result = subprocess.run([ldconfig, "-p", "-C", cache], capture_output=True, text=True,
                            check=False, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"})
    files = select_driver_libs(parse_ld_cache(result.stdout), root)
    if not any(os.path.basename(f.container_path).startswith("libcuda.so") for f in files):
        raise HamiError("config driver_root", root, "its ld cache lists no libcuda.so")
    real_root = os.path.realpath(root)
    for capability, programs in driver_capabilities.PROGRAMS.items():
        for program in programs:
            for place in PROGRAM_DIRS:
                host = os.path.realpath(os.path.join(root, place, program))
                if host.startswith(real_root.rstrip("/") + "/") and os.path.isfile(host):
                    files.append(DriverFile(host, f"/{place}/{program}", capability))
                    break  # the first place that has it, as PATH would find it
    return files
