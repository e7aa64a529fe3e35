#!/usr/bin/env python3
"""Makes an OCI bundle to run through hami-runtime: a busybox + vgpu-probe rootfs
(build_image.py's) and a `runc spec` config.json with the given annotations,
env and command.

    make_bundle.py BUNDLE [--annotation KEY=VALUE ...] [--env KEY=VALUE ...] -- COMMAND ...

The rootfs carries the glibc libraries that libvgpu and the driver's libraries
need: the host driver's when the host has one (/dev/nvidiactl and libcuda.so.1
in the ld cache), else the simulated driver's under build/sim.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import build_image

ROOT = build_image.HERE.parent.parent
SIM_DRIVER = ["build/sim/lib/libcuda.so.1", "build/sim/lib/libnvidia-ml.so.1", "build/sim/bin/nvidia-smi"]
HOST_DRIVER_SONAMES = ("libcuda.so.1", "libnvidia-ml.so.1")


def driver_files() -> list:
    """The driver files whose libraries the rootfs must carry."""
    if os.path.exists("/dev/nvidiactl"):
        cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
        found = [Path(line.split()[-1]) for line in cache.splitlines()
                 if line.strip().split(" ")[0] in HOST_DRIVER_SONAMES]
        if any(p.name == "libcuda.so.1" for p in found):
            return found
    return [ROOT / p for p in SIM_DRIVER]


def pairs(values: list, option: str) -> dict:
    result = {}
    for item in values:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise SystemExit(f"make_bundle: {option} {item!r}: expected KEY=VALUE")
        result[key] = value
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--annotation", action="append", default=[])
    parser.add_argument("--env", action="append", default=[])
    parser.add_argument("command", nargs="+")
    args = parser.parse_args(argv)
    args.bundle.mkdir(parents=True, exist_ok=True)
    libs = [p for p in [ROOT / "build" / "libvgpu.so", *driver_files()] if p.exists()]
    with tempfile.TemporaryDirectory() as work:
        probe = build_image.compile_probe(Path(work))
        build_image.build_rootfs(args.bundle / "rootfs", probe, libs)
    (args.bundle / "config.json").unlink(missing_ok=True)
    subprocess.run(["runc", "spec", "--bundle", str(args.bundle)], check=True)
    spec_path = args.bundle / "config.json"
    spec = json.loads(spec_path.read_text())
    spec["process"]["terminal"] = False
    spec["process"]["args"] = args.command
    spec["process"]["env"] += [f"{k}={v}" for k, v in pairs(args.env, "--env").items()]
    spec["annotations"] = pairs(args.annotation, "--annotation")
    spec_path.write_text(json.dumps(spec, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
