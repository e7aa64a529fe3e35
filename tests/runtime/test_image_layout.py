"""An ordinary image under what holds the slice (/etc a mount point of its own,
libvgpu's files under /.hami): its shell, user edits as adduser makes them, a
package manager, the engine's /etc/hosts and a read-only root behave as under
runc, and a CUDA program is held to the slice. An image whose /etc,
/etc/ld.so.preload or /.hami the runtime could not hold is refused before
anything is allocated."""
import io
import json
import shutil
import subprocess
import tarfile

import pytest

from .node import CUDA_ALLOC, RUNC, TIMEOUT
from .test_tenant import DEFAULT_CAPS, HELD, SLICE

pytestmark = pytest.mark.skipif(not CUDA_ALLOC.exists(), reason="make sim builds the test program")

# what an image's own processes do in /etc: adduser's edits (an append, and sed -i's
# new file renamed over the old), a package installed by dpkg, the engine's /etc/hosts
# written, a user switched to by name
WORK = ("ls /etc; cat /etc/hosts; echo '10.1.1.1 db' >> /etc/hosts; "
        "echo 'app:x:1000:1000::/home/app:/bin/sh' >> /etc/passwd && echo 'app:x:1000:' >> /etc/group && "
        "sed -i 's|^app:x:1000:1000::|app:x:1000:1000:App:|' /etc/passwd && "
        "id app; su -s /bin/sh app -c whoami; "
        "mkdir -p /var/lib/dpkg/info && touch /var/lib/dpkg/status && dpkg -i /hello.deb && cat /etc/hello.conf; "
        "ls /etc; id")


def deb() -> bytes:
    """A package of one file, /etc/hello.conf (ar of debian-binary, control, data)."""
    def tar(name, data):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as t:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            t.addfile(info, io.BytesIO(data))
        return buf.getvalue()
    members = [("debian-binary", b"2.0\n"),
               ("control.tar.gz", tar("./control", b"Package: hello\nVersion: 1.0\nArchitecture: all\n"
                                                   b"Maintainer: t <t@example.com>\nDescription: one file\n")),
               ("data.tar.gz", tar("./etc/hello.conf", b"greeting = hi\n"))]
    out = b"!<arch>\n"
    for name, data in members:
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(data):<10}`\n".encode() + data
        out += b"\n" * (len(data) % 2)
    return out


def image(node, name):
    """A rootfs of its own: the test rootfs with a package to install."""
    root = node.private_rootfs(name)
    (root / "hello.deb").write_bytes(deb())
    return root


def run(node, cid, annotations, script, readonly, runtime=True):
    """`script` in a container (root, the engines' default capabilities, /etc/hosts
    mounted from the host as engines mount it) through hami-runtime, or runc alone."""
    root = image(node, cid)
    hosts = node.tmp / f"hosts-{cid}"
    hosts.write_text("127.0.0.1 localhost\n")
    bundle = node.bundle(cid, annotations, args=("sh", "-c", script), rootfs=root, readonly=readonly)
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["capabilities"] = {k: list(DEFAULT_CAPS) for k in ("bounding", "effective", "permitted")}
    spec["mounts"].append({"destination": "/etc/hosts", "type": "bind", "source": str(hosts),
                           "options": ["rbind", "rprivate"]})
    (bundle / "config.json").write_text(json.dumps(spec))
    if runtime:
        proc = node.runtime("run", "--bundle", str(bundle), cid)
    else:
        proc = subprocess.run([RUNC, "--root", str(node.runc_root), "run", "--bundle", str(bundle), cid],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT)
    return proc, root, hosts


def seen(text):
    """What the image saw, less the preload's mount point (runc makes it in the rootfs
    the first time a GPU container runs there, as before) and the CUDA program's lines."""
    return [line for line in text.splitlines()
            if "ld.so.preload" not in line and not line.startswith(("alloc ", "init ", "total "))]


@pytest.mark.parametrize("readonly", [False, True], ids=["writable root", "read-only root"])
def test_an_ordinary_image_behaves_as_under_runc(node, readonly):
    plain, plain_root, plain_hosts = run(node, "plain", None, WORK, readonly, runtime=False)
    gpu, gpu_root, gpu_hosts = run(node, "gpu", SLICE, f"{WORK}; cuda_alloc 600 600", readonly)
    assert seen(gpu.stdout) == seen(plain.stdout), (plain.stdout, gpu.stdout)
    assert seen(gpu.stderr) == seen(plain.stderr), (plain.stderr, gpu.stderr)
    assert [line for line in gpu.stdout.splitlines() if line.startswith("alloc ")] == HELD, gpu.stdout
    assert gpu_hosts.read_text() == plain_hosts.read_text() == "127.0.0.1 localhost\n10.1.1.1 db\n"
    for name in ("passwd", "group", "hello.conf"):  # what it wrote is in its rootfs
        assert (gpu_root / "etc" / name).exists() == (plain_root / "etc" / name).exists() == (not readonly)
        if not readonly:
            assert (gpu_root / "etc" / name).read_bytes() == (plain_root / "etc" / name).read_bytes()
    if not readonly:
        assert "uid=1000(app) gid=1000(app)" in gpu.stdout and "app\n" in gpu.stdout, gpu.stdout + gpu.stderr
        assert "greeting = hi\n" in gpu.stdout, gpu.stdout + gpu.stderr
    else:
        assert "Read-only file system" in gpu.stderr


@pytest.mark.parametrize("readonly", [False, True], ids=["writable root", "read-only root"])
def test_an_image_without_etc_gets_an_empty_one(node, readonly):
    """runc would make the directory in the rootfs; a tmpfs stands there, a mount
    point as /etc is in other images, writable as the root is."""
    root = node.private_rootfs("bare")
    shutil.rmtree(root / "etc")
    bundle = node.bundle("bare", SLICE, rootfs=root, readonly=readonly, args=(
        "sh", "-c", "ls -A /etc; grep ' /etc ' /proc/self/mountinfo | cut -d' ' -f9; touch /etc/x && echo written; "
        "mv /etc /e; cuda_alloc 600 600"))
    proc = node.runtime("run", "--bundle", str(bundle), "bare")
    assert proc.stdout.splitlines()[:2] == ["ld.so.preload", "tmpfs"], proc.stdout + proc.stderr
    assert ("written" in proc.stdout.splitlines()) == (not readonly), proc.stdout + proc.stderr
    assert [line for line in proc.stdout.splitlines() if line.startswith("alloc ")] == HELD
    assert "can't rename '/etc'" in proc.stderr


def plant(path, kind):
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    if kind == "link":
        path.symlink_to("/tmp")
    else:
        path.write_text("")


# (what the image has, where) -> the refusal's field and what it says
SHAPES = {
    "/etc a link": ("etc", "link", "root /etc", "is a symbolic link in the image"),
    "/etc a file": ("etc", "file", "root /etc", "is a regular file in the image"),
    "/etc/ld.so.preload a link": ("etc/ld.so.preload", "link", "root /etc/ld.so.preload",
                                  "is a symbolic link in the image"),
    "/.hami a link": (".hami", "link", "root /.hami", "is a symbolic link in the image"),
    "/.hami a file": (".hami", "file", "root /.hami", "is a regular file in the image"),
}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_an_image_the_runtime_cannot_hold_is_refused(node, shape):
    """runc would mount at a link's target and leave the link, which the tenant can
    rename, on the loader's path: refused, one line, nothing allocated."""
    where, kind, field, reason = shape
    root = node.private_rootfs("odd")
    plant(root / where, kind)
    bundle = node.bundle("odd", SLICE, rootfs=root, args=("true",))
    proc = node.runtime("run", "--bundle", str(bundle), "odd")
    assert proc.returncode == 1
    assert f"{field}=" in proc.stderr and reason in proc.stderr, proc.stderr
    assert node.allocations() == {} and node.containers() == []
