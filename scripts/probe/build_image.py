#!/usr/bin/env python3
"""Builds the small local image the demo and the engine tests run: busybox-static
plus vgpu-probe (a glibc program) and the glibc libraries it and the injected
driver libraries need. No registry is used.

    build_image.py OUT_DIR [--lib-from FILE ...]

writes OUT_DIR/vgpu-probe (the compiled program), OUT_DIR/rootfs/ (a bundle
rootfs), OUT_DIR/rootfs.tar (for `podman import`) and OUT_DIR/image.tar (a
`docker save` archive for `docker load` and `ctr image import`, tagged
hami-probe:latest). --lib-from adds the glibc libraries that FILE links to
(the driver libraries the runtime will inject, libvgpu.so).
"""
import argparse
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
IMAGE_TAG = "hami-probe:latest"
PROBE_IN_IMAGE = "/usr/local/bin/vgpu-probe"
# The driver's own user-space libraries link these; the image must carry them.
BASE_LIBS = ["libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1"]
LIB_DIR = "lib/x86_64-linux-gnu"


def compile_probe(out: Path) -> Path:
    binary = out / "vgpu-probe"
    cc = os.environ.get("CC", "gcc")
    subprocess.run([cc, "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(binary),
                    str(HERE / "vgpu-probe.c"), "-ldl"], check=True)
    return binary


def linked_libraries(binary: Path) -> dict:
    """name -> host path, from ldd (the loader's own view)."""
    result = subprocess.run(["ldd", str(binary)], capture_output=True, text=True)
    found = {}
    for line in result.stdout.splitlines():
        match = re.match(r"\s*(\S+)\s+=>\s+(/\S+)", line) or re.match(r"\s*(/\S+ld-linux\S*)\s", line)
        if match:
            path = match.groups()[-1]
            found[Path(match.group(1)).name] = Path(path)
    return found


def host_library(name: str) -> Path:
    for directory in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64"):
        candidate = Path(directory) / name
        if candidate.exists():
            return candidate
    raise SystemExit(f"build_image: host library not found: {name}")


def build_rootfs(rootfs: Path, probe: Path, extra: list) -> None:
    if rootfs.exists():
        shutil.rmtree(rootfs)
    for d in ("bin", "etc", "dev", "proc", "sys", "tmp", "usr/local/bin", LIB_DIR, "lib64"):
        (rootfs / d).mkdir(parents=True, exist_ok=True)
    os.chmod(rootfs / "tmp", 0o1777)
    shutil.copy2("/bin/busybox", rootfs / "bin" / "busybox")
    applets = subprocess.run(["/bin/busybox", "--list"], capture_output=True, text=True,
                             check=True).stdout.split()
    for applet in applets:
        if applet != "busybox":
            (rootfs / "bin" / applet).symlink_to("busybox")
    shutil.copy2(probe, rootfs / PROBE_IN_IMAGE.lstrip("/"))
    libs = {name: host_library(name) for name in BASE_LIBS}
    for binary in [probe, *extra]:
        libs.update(linked_libraries(binary))
    for name, path in libs.items():
        if name.startswith("ld-linux"):
            shutil.copy2(path, rootfs / "lib64" / name)
        elif not (rootfs / LIB_DIR / name).exists():
            shutil.copy2(path.resolve(), rootfs / LIB_DIR / name)
    (rootfs / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (rootfs / "etc" / "group").write_text("root:x:0:\n")


def _reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = 0
    return info


def write_rootfs_tar(rootfs: Path, target: Path) -> None:
    with tarfile.open(target, "w") as tar:
        for entry in sorted(rootfs.iterdir()):
            tar.add(entry, arcname=entry.name, filter=_reset)


def write_docker_archive(layer_tar: Path, target: Path, tag: str = IMAGE_TAG,
                         cmd: tuple = (PROBE_IN_IMAGE, "info")) -> None:
    layer = layer_tar.read_bytes()
    diff_id = hashlib.sha256(layer).hexdigest()
    config = json.dumps({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": ["PATH=/usr/local/bin:/bin"], "Cmd": list(cmd)},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
        "history": [{"created_by": "scripts/probe/build_image.py"}],
    }, sort_keys=True).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [tag],
                            "Layers": [f"{diff_id}/layer.tar"]}]).encode()
    with tarfile.open(target, "w") as tar:
        for name, data in ((config_name, config), (f"{diff_id}/layer.tar", layer),
                           ("manifest.json", manifest)):
            info = _reset(tarfile.TarInfo(name))
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--lib-from", type=Path, action="append", default=[])
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    probe = compile_probe(args.out)
    extra = [p for p in args.lib_from if p.exists()]
    build_rootfs(args.out / "rootfs", probe, extra)
    write_rootfs_tar(args.out / "rootfs", args.out / "rootfs.tar")
    write_docker_archive(args.out / "rootfs.tar", args.out / "image.tar")
    return 0


if __name__ == "__main__":
    sys.exit(main())
