"""make k8s-image: the image deploy/'s DaemonSet runs (hami-runtime-node:<version>),
built with no registry, as an OCI archive that podman and containerd import.

  k8s_image.py [--build build] [--out build/k8s] [--mirror URL] [--suite NAME]

One layer: a Debian rootfs made by debootstrap --variant=minbase from the
host's Debian mirror (its apt sources name it) with Python, make and a C
compiler; on it the project's tree at /opt/hami-runtime as make builds it
(libvgpu.so, the launcher's header, the region module), the wheelhouse of
packaging/requirements.txt for the image's Python and make's stamps, so that
`make install` (packaging/node_installer.py runs it) works offline there.

The debootstrap result is kept under OUT/rootfs-<key> (the key: mirror, suite,
architecture and package list), so that a rebuild only repacks the tree.
debootstrap itself, where the host has none, is unpacked from its Debian
package (apt-get download) under OUT/tools: nothing is installed on the host.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "packaging"))
import install  # noqa: E402  (the wheelhouse, the version, as make install has them)

NAME = "hami-runtime-node"
PACKAGES = ("python3", "python3-venv", "python3-pip", "make", "gcc", "libc6-dev")
PREFIX = "opt/hami-runtime"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# what make builds into the tree and make install reads; the stamps stand for
# the development environment, which the image does not need
# (and the modules make build generates in the package: its ignored files)
BUILT = ("build/libvgpu.so", "build/hami-runtime", "build/launcher/spec_keys.h",
         "hami_runtime/node/_region_ffi.py")


def log(msg: str) -> None:
    print(f"k8s-image: {msg}", flush=True)


def apt_source() -> tuple[str, str]:
    """(mirror, suite) of the host's first Debian apt source."""
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        fields = {}
        for line in path.read_text().splitlines() + [""]:
            if not line.strip():
                if "URIs" in fields and "Suites" in fields and "deb" in fields.get("Types", "deb").split():
                    if fields["URIs"].split()[0].rstrip("/").endswith("/debian"):
                        return fields["URIs"].split()[0], fields["Suites"].split()[0]
                fields = {}
            elif not line.startswith("#") and ":" in line:
                key, value = line.split(":", 1)
                fields[key.strip()] = value.strip()
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*.list"))]:
        if path.exists():
            for line in path.read_text().splitlines():
                words = [w for w in line.split() if not w.startswith("[")]
                if len(words) >= 3 and words[0] == "deb" and words[1].rstrip("/").endswith("/debian"):
                    return words[1], words[2]
    raise SystemExit("k8s-image: no Debian mirror in /etc/apt/sources.list*: give --mirror and --suite")


def debootstrap_command(out: Path) -> tuple[list, dict]:
    found = shutil.which("debootstrap")
    if found:
        return [found], {}
    tools = out / "tools"
    script = tools / "root" / "usr" / "sbin" / "debootstrap"
    if not script.exists():
        shutil.rmtree(tools, ignore_errors=True)
        tools.mkdir(parents=True)
        subprocess.run(["apt-get", "download", "-q", "debootstrap"], cwd=tools, check=True)
        deb = next(tools.glob("debootstrap_*.deb"))
        subprocess.run(["dpkg-deb", "-x", str(deb), str(tools / "root")], check=True)
    return [str(script)], {"DEBOOTSTRAP_DIR": str(tools / "root" / "usr" / "share" / "debootstrap")}


def rootfs(out: Path, mirror: str, suite: str, arch: str) -> Path:
    """The debootstrap result for this key, made once."""
    spec = "\n".join([mirror, suite, arch, "minbase", *sorted(PACKAGES)]) + "\n"
    key = hashlib.sha256(spec.encode()).hexdigest()[:16]
    target = out / f"rootfs-{key}"
    if (target / ".complete").exists():
        log(f"Debian rootfs {target} (cached)")
        return target
    partial = out / f"rootfs-{key}.partial"
    if partial.exists():
        subprocess.run(["rm", "-rf", "--one-file-system", str(partial)], check=True)
    argv, env = debootstrap_command(out)
    log(f"debootstrap --variant=minbase {suite} from {mirror} ({', '.join(PACKAGES)})")
    start = time.monotonic()
    subprocess.run([*argv, "--variant=minbase", f"--arch={arch}", f"--include={','.join(PACKAGES)}",
                    suite, str(partial), mirror], check=True, env={**os.environ, **env})
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for path in (partial / junk).glob("*"):
            if path.is_file():
                path.unlink()
    (partial / "etc" / "hami-rootfs.key").write_text(spec)
    partial.rename(target)
    (target / ".complete").write_text(f"{time.monotonic() - start:.0f}s\n")
    log(f"debootstrap took {time.monotonic() - start:.0f}s: {target}")
    return target


def image_python(base: Path) -> install.Interpreter:
    """The host's /usr/bin/python3 stands in for the image's to key the wheelhouse:
    they must be the same version (both the suite's python3)."""
    interp = install.Interpreter("/usr/bin/python3")
    if not (base / "usr" / "bin" / f"python{interp.version}").exists():
        raise SystemExit(f"k8s-image: the rootfs has no python{interp.version} (the host's): "
                         "build the image on a host of the same Debian release")
    return interp


def tree_files(build: Path, house: Path) -> list[tuple[str, Path]]:
    """(path in the tree, source) of everything /opt/hami-runtime holds."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], capture_output=True, check=True).stdout
    names = [n for n in listed.decode().split("\0") if n]
    generated = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--others", "--ignored",
                                "--exclude-standard", "hami_runtime"], capture_output=True, check=True).stdout
    names += [n for n in generated.decode().split("\0")
              if n.endswith(".py") and "__pycache__" not in n and ".egg-info" not in n]
    files = [(n, ROOT / n) for n in names if (ROOT / n).is_file() or (ROOT / n).is_symlink()]
    for name in BUILT:
        if not (ROOT / name).exists():
            raise SystemExit(f"k8s-image: {name} missing: run make build first")
        files.append((name, ROOT / name))
    rel = house.relative_to(ROOT) if house.is_relative_to(ROOT) else Path("build/wheelhouse") / house.name
    for path in sorted(house.iterdir()):
        files.append((str(rel / path.name), path))
    return sorted(set(files))


class Hashing(io.RawIOBase):
    """A writable that hashes and counts what passes, into another."""

    def __init__(self, sink):
        self.sink, self.sha, self.size = sink, hashlib.sha256(), 0

    def writable(self):
        return True

    def write(self, data):
        self.sha.update(data)
        self.size += len(data)
        self.sink.write(data)
        return len(data)


def layer(base: Path, files, stamp_time: float, blob: Path) -> tuple[str, str, int, int]:
    """The rootfs and the tree as one gzip'd tar layer: (diff_id, digest, size, tar size)."""
    with open(blob, "wb") as raw:
        compressed = Hashing(raw)
        with gzip.GzipFile(fileobj=compressed, mode="wb", compresslevel=6, mtime=0) as gz:
            plain = Hashing(gz)
            with tarfile.open(fileobj=plain, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                def skip(info):
                    top = info.name.split("/")
                    if info.name == ".complete" or (len(top) > 1 and top[0] in ("proc", "sys", "dev", "run")):
                        return None
                    info.uname = info.gname = ""  # the rootfs's numeric owners, not the host's names
                    return info
                for entry in sorted(os.listdir(base)):
                    tar.add(base / entry, arcname=entry, filter=skip)
                made = set()

                def directory(name):
                    if name and name not in made and not (base / name).is_dir():
                        directory(os.path.dirname(name))
                        info = tarfile.TarInfo(name)
                        info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, int(stamp_time)
                        tar.addfile(info)
                    made.add(name)

                def owned(info):
                    info.uid = info.gid = 0
                    info.uname = info.gname = "root"
                    return info
                for name, source in files:
                    arc = f"{PREFIX}/{name}"
                    directory(os.path.dirname(arc))
                    tar.add(source, arcname=arc, recursive=False, filter=owned)
                # make's stamps: the development environment stands for itself
                # (.venv/bin/python runs packaging/install.py with the image's pip)
                for name, target in ((f"{PREFIX}/.venv/bin/python", "/usr/bin/python3"),):
                    directory(os.path.dirname(name))
                    info = tarfile.TarInfo(name)
                    info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, int(stamp_time)
                    tar.addfile(info)
                for name in (f"{PREFIX}/.venv/.installed", f"{PREFIX}/build/.deps"):
                    directory(os.path.dirname(name))
                    info = tarfile.TarInfo(name)
                    info.mode, info.mtime, info.size = 0o644, int(stamp_time), 0
                    tar.addfile(info)
    return (f"sha256:{plain.sha.hexdigest()}", f"sha256:{compressed.sha.hexdigest()}",
            compressed.size, plain.size)


def oci_archive(out_tar: Path, layer_blob: Path, diff_id: str, digest: str, size: int,
                version: str, suite: str, arch: str) -> str:
    """The OCI image layout of one image, as a tar; the manifest's digest."""
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    config = {
        "created": created, "architecture": arch, "os": "linux",
        "config": {
            "Env": [f"PATH={PATH}", "LANG=C.UTF-8"],
            "Cmd": ["python3", f"/{PREFIX}/packaging/node_installer.py", "--help"],
            "WorkingDir": f"/{PREFIX}",
            "Labels": {"org.opencontainers.image.title": NAME,
                       "org.opencontainers.image.version": version,
                       "org.opencontainers.image.base.name": f"debian:{suite} (debootstrap minbase)"},
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": created, "created_by": "make k8s-image (scripts/k8s_image.py)"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_desc = {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": f"sha256:{hashlib.sha256(config_bytes).hexdigest()}", "size": len(config_bytes)}
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": config_desc,
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                            "digest": digest, "size": size}]}
    manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
    manifest_digest = f"sha256:{hashlib.sha256(manifest_bytes).hexdigest()}"
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": [{"mediaType": manifest["mediaType"], "digest": manifest_digest,
                            "size": len(manifest_bytes),
                            "platform": {"architecture": arch, "os": "linux"},
                            "annotations": {
                                # containerd (ctr images import, kubelet's k8s.io namespace) and podman
                                "io.containerd.image.name": f"docker.io/library/{NAME}:{version}",
                                "org.opencontainers.image.ref.name": f"{NAME}:{version}"}}]}
    partial = out_tar.with_name(out_tar.name + ".partial")
    with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
        def add_bytes(name, data):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
        add_bytes("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add_bytes("index.json", json.dumps(index, sort_keys=True).encode())
        add_bytes(f"blobs/sha256/{config_desc['digest'][7:]}", config_bytes)
        add_bytes(f"blobs/sha256/{manifest_digest[7:]}", manifest_bytes)
        info = tar.gettarinfo(str(layer_blob), arcname=f"blobs/sha256/{digest[7:]}")
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        with open(layer_blob, "rb") as f:
            tar.addfile(info, f)
    partial.rename(out_tar)
    return manifest_digest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="k8s_image.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default=str(ROOT / "build"))
    parser.add_argument("--out", default=None, help="default: BUILD/k8s")
    parser.add_argument("--mirror")
    parser.add_argument("--suite")
    args = parser.parse_args(argv)
    build = Path(args.build).resolve()
    out = Path(args.out).resolve() if args.out else build / "k8s"
    out.mkdir(parents=True, exist_ok=True)
    mirror, suite = apt_source() if not (args.mirror and args.suite) else (args.mirror, args.suite)
    mirror, suite = args.mirror or mirror, args.suite or suite
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True,
                          check=True).stdout.strip()
    started = time.monotonic()
    base = rootfs(out, mirror, suite, arch)
    house = install.wheelhouse(build, image_python(base))
    version = install.version()
    files = tree_files(build, house)
    blob = out / "layer.tar.gz.partial"
    log(f"packing the rootfs and /{PREFIX} ({len(files)} files)")
    diff_id, digest, size, plain = layer(base, files, time.time(), blob)
    target = out / f"{NAME}-{version}.oci.tar"
    manifest = oci_archive(target, blob, diff_id, digest, size, version, suite, arch)
    blob.unlink()
    log(f"{target}: {NAME}:{version}, {target.stat().st_size / 2**20:.0f} MiB "
        f"(layer {plain / 2**20:.0f} MiB unpacked), manifest {manifest[:19]}, "
        f"{time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
