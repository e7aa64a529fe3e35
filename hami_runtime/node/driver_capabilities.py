"""NVIDIA_DRIVER_CAPABILITIES: which of the driver's files a container gets.

The classes and their files are NVIDIA's (libnvidia-container's lists): a
library belongs to a class by its soname, a program by its name. `display`
names no file (NVIDIA's runtime gives none either: X server modules are not for
containers), and `compat32` adds the 32-bit copies of the libraries of the
other classes asked for. Unset or empty means NVIDIA's default, compute and
utility; `all` every class; `none` no driver file at all.
"""
from __future__ import annotations

from ..errors import HamiError

VARIABLE = "NVIDIA_DRIVER_CAPABILITIES"
CLASSES = ("compute", "compat32", "graphics", "utility", "video", "display", "ngx")
DEFAULT = frozenset({"compute", "utility"})

# class -> soname prefixes (a soname is the prefix and a version: libcuda.so.1)
LIBRARIES = {
    "utility": ("libnvidia-ml.so", "libnvidia-cfg.so", "libnvidia-nscq.so"),
    "compute": ("libcuda.so", "libcudadebugger.so", "libnvidia-opencl.so", "libnvidia-gpucomp.so",
                "libnvidia-ptxjitcompiler.so", "libnvidia-fatbinaryloader.so", "libnvidia-allocator.so",
                "libnvidia-compiler.so", "libnvidia-pkcs11.so", "libnvidia-pkcs11-openssl3.so",
                "libnvidia-nvvm.so", "libnvidia-tileiras.so"),
    "video": ("libvdpau_nvidia.so", "libnvidia-encode.so", "libnvidia-opticalflow.so", "libnvcuvid.so"),
    "graphics": ("libnvidia-eglcore.so", "libnvidia-glcore.so", "libnvidia-tls.so", "libnvidia-glsi.so",
                 "libnvidia-fbc.so", "libnvidia-ifr.so", "libnvidia-rtcore.so", "libnvoptix.so",
                 "libGLX_nvidia.so", "libEGL_nvidia.so", "libGLESv2_nvidia.so", "libGLESv1_CM_nvidia.so",
                 "libnvidia-glvkspirv.so", "libnvidia-cbl.so"),
    "ngx": ("libnvidia-ngx.so",),
}
PROGRAMS = {
    "utility": ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nv-fabricmanager"),
    "compute": ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server"),
}


def library_class(soname: str) -> str | None:
    """The class of a driver library by its soname; None for any other library."""
    for name, prefixes in LIBRARIES.items():
        for prefix in prefixes:
            rest = soname[len(prefix):]
            if soname.startswith(prefix) and (rest == "" or rest.startswith(".")):
                return name
    return None


def parse(value: str | None) -> frozenset:
    """The classes a container asks for."""
    items = [item.strip() for item in (value or "").split(",") if item.strip()]
    if not items:
        return DEFAULT
    if "all" in items:
        return frozenset(CLASSES)
    if items == ["none"]:
        return frozenset()
    unknown = [item for item in items if item not in CLASSES]
    if unknown:
        raise HamiError(VARIABLE, value, f"{unknown[0]!r} is not a driver capability (one of "
                        + ", ".join(CLASSES) + ", all, none)")
    return frozenset(items)


def chosen(files, classes: frozenset) -> list:
    """The driver files (discovery.DriverFile) of these classes."""
    return [f for f in files if f.capability in classes and (f.bits == 64 or "compat32" in classes)]
