"""Where the files of the install this package runs from are.

``make install`` (and the .deb) put the runtime's Python environment at
``<prefix>/lib/hami/venv``, ``libvgpu.so`` beside it at
``<prefix>/lib/hami/libvgpu.so`` and ``region.h`` in the environment's
``share/hami/``. The launcher starts Python with -S, so ``sys.prefix`` is the
base interpreter's there: the package's own path is what tells the install.
"""
from __future__ import annotations

import os

LIBVGPU_ELSEWHERE = "/usr/local/lib/hami/libvgpu.so"  # a source tree, or another layout


def environment_of(package_file: str) -> str:
    """The environment whose site-packages (<env>/lib/pythonX.Y/site-packages)
    holds the package of this file; "" when it lies elsewhere (a source tree)."""
    site = os.path.dirname(os.path.dirname(os.path.abspath(package_file)))
    lib_python, name = os.path.split(site)
    lib, python = os.path.split(lib_python)
    if name != "site-packages" or not python.startswith("python") or \
            os.path.basename(lib) not in ("lib", "lib64"):
        return ""
    return os.path.dirname(lib)


def libvgpu_of(env: str) -> str:
    """The libvgpu.so beside an environment of make install's layout."""
    hami_lib, name = os.path.split(env)
    if env and name == "venv" and os.path.basename(hami_lib) == "hami":
        return os.path.join(hami_lib, "libvgpu.so")
    return LIBVGPU_ELSEWHERE


ENVIRONMENT = environment_of(__file__)
LIBVGPU = libvgpu_of(ENVIRONMENT)
REGION_HEADER = os.path.join(ENVIRONMENT, "share", "hami", "region.h") if ENVIRONMENT else ""
