"""make deb: the same layout under /usr as a Debian package whose files name
/usr only, with its dependencies and conffile declared; its tree, laid over
/usr in a mount namespace of its own, runs a GPU container with its defaults."""
import hashlib
import json
import os
import re
import subprocess

import pytest

from tests.conftest import ROOT
from tests.runtime.node import CUDA_ALLOC, TIMEOUT
from .conftest import DISTRO_PYTHON, InstalledNode, make
from .test_install import GPU, files_under, naming


def dpkg_deb(*args):
    return subprocess.run(["dpkg-deb", *map(str, args)], capture_output=True, text=True, check=True,
                          timeout=TIMEOUT).stdout


def project_version():
    return re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)


@pytest.fixture(scope="module")
def deb(tmp_path_factory):
    out = tmp_path_factory.mktemp("deb")
    proc = make("deb", f"DEB_DIR={out}")
    assert proc.returncode == 0, proc.stdout[-4000:]
    [package] = out.glob("hami-runtime_*.deb")
    tree = out / "tree"
    dpkg_deb("-x", package, tree)
    return package, tree


def test_control_fields(deb):
    package, _ = deb
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert package.name == f"hami-runtime_{project_version()}_{arch}.deb"
    fields = dpkg_deb("-f", package, "Package", "Version", "Architecture")
    assert fields.split("\n")[:3] == ["Package: hami-runtime", f"Version: {project_version()}",
                                      f"Architecture: {arch}"]
    depends = [d.strip() for d in dpkg_deb("-f", package, "Depends").split(",")]
    minor = os.path.basename(os.path.realpath(DISTRO_PYTHON))  # python3.X
    assert depends[:2] == [minor, "runc"]
    assert re.fullmatch(r"libc6 \(>= 2\.\d+\)", depends[2])
    assert dpkg_deb("-I", package, "conffiles").split() == ["/etc/hami/config.toml"]


def test_files_name_usr_only(deb):
    package, tree = deb
    listing = dpkg_deb("-c", package)
    for entry in ("./usr/bin/hami-runtime -> ../lib/hami/hami-runtime", " ./usr/bin/hamictl\n",
                  " ./usr/bin/hami-hook\n", " ./usr/lib/hami/hami-runtime\n",
                  " ./usr/lib/hami/libvgpu.so\n", " ./usr/lib/hami/venv/share/hami/region.h\n",
                  " ./etc/hami/config.toml\n"):
        assert entry in listing, entry
    assert "nvidia-container-runtime-hook" not in listing  # NVIDIA's package ships one
    assert re.search(r" root/root .* \./usr/lib/hami/hami-runtime\n", listing)
    venv = tree / "usr" / "lib" / "hami" / "venv"
    python = os.path.basename(os.path.realpath(DISTRO_PYTHON))
    assert os.readlink(venv / "bin" / python) == f"/usr/bin/{python}"
    assert "home = /usr/bin\n" in (venv / "pyvenv.cfg").read_text()
    launcher = (tree / "usr" / "lib" / "hami" / "hami-runtime").read_bytes()
    assert b"/usr/lib/hami/venv/bin/python3\0" in launcher
    assert f"/usr/lib/hami/venv/lib/{python}/site-packages".encode() in launcher
    assert (tree / "usr" / "bin" / "hamictl").read_text().splitlines()[-1] == \
        'exec /usr/lib/hami/venv/bin/python3 -I /usr/lib/hami/venv/bin/hamictl "$@"'
    assert naming(tree, str(ROOT)) == [] and naming(tree, "venv.new") == []
    assert {p.parts[len(tree.parts)] for p in files_under(tree)} == {"etc", "usr"}


def test_md5sums_cover_every_file(deb):
    package, tree = deb
    listed = {}
    for line in dpkg_deb("-I", package, "md5sums").splitlines():
        digest, path = line.split("  ", 1)
        listed[path] = digest
    files = [p for p in files_under(tree) if not p.is_symlink()]
    assert {str(p.relative_to(tree)) for p in files} == set(listed)
    for path in files[:50]:
        assert hashlib.md5(path.read_bytes()).hexdigest() == listed[str(path.relative_to(tree))]


def over_usr(tree):
    """A command prefix: run in a mount namespace where the package's /usr is
    laid over the host's, as dpkg would have put it there."""
    script = f'mount -t overlay hami-deb -o lowerdir={tree}/usr:/usr /usr && exec "$@"'
    probe = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", "true"], capture_output=True,
                           text=True, timeout=TIMEOUT)
    if probe.returncode != 0:
        pytest.skip(f"cannot lay the package over /usr here: {probe.stderr.strip()}")
    return ["/usr/bin/unshare", "-m", "/bin/sh", "-c", script, "sh"]


@pytest.mark.skipif(not CUDA_ALLOC.exists(), reason="make sim builds the test program")
def test_package_runs_a_gpu_container_with_its_defaults(deb, tmp_path, rootfs, spec_template, sim_copy):
    """/usr/bin/hami-runtime of the package, with a config that names no
    libvgpu: the container gets /usr/lib/hami/libvgpu.so, its limit holds."""
    _, tree = deb
    wrap = over_usr(tree)
    node = InstalledNode(tmp_path, rootfs, spec_template, sim_copy,
                         wrap + ["/usr/bin/hami-runtime"], wrap + ["/usr/bin/hamictl"])
    try:
        bundle = node.bundle("d1", GPU, args=("cuda_alloc", "2000", "1500"))
        proc = node.runtime("run", "--bundle", str(bundle), "d1")
        assert proc.returncode == 0, proc.stderr
        spec = json.loads((bundle / "config.json").read_text())
        [lib] = [m for m in spec["mounts"] if m["destination"] == "/usr/local/vgpu/libvgpu.so"]
        assert lib["source"] == "/usr/lib/hami/libvgpu.so"
        lines = proc.stdout.splitlines()
        assert "total 3000" in lines and ["alloc 2000 0", "alloc 1500 2"] == lines[-2:]
        assert node.ps() == []  # runc run removed it: dead, not shown
        node.reconcile()  # the next create or delete frees it
        assert node.allocations() == {}
    finally:
        node.cleanup()
