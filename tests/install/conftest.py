"""Fixtures: the project installed with make install (or make deb) into a
temporary prefix, with the distribution's python3 first on PATH, and a node
whose runtime and hamictl are the installed ones, run with no environment but
the config's and the simulator's."""
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.runtime.conftest import rootfs, sim_copy, spec_template  # noqa: F401 (fixtures)
from tests.runtime.node import Node, TIMEOUT

DISTRO_PYTHON = Path("/usr/bin/python3")
DISTRO_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"  # the distribution's python3 first
MAKE_TIMEOUT = 300
# uninstall removes the node's config cache (/var/cache/hami, /var/lib/hami) under
# NODE_ROOT: here one that never exists, so no test removes the host's; a test of
# that removal names its own
NO_NODE_ROOT = str(ROOT / "build" / "tests-no-node-root")


def make(*args, env=None, wrap=()):
    """make in this tree with the distribution's PATH (nothing of the build
    venv's or a pyenv's); stdout and stderr together. The build venv that runs
    these tests is never remade (-o): its python3 is not this PATH's."""
    if not DISTRO_PYTHON.exists():
        pytest.skip("no distribution python3 at /usr/bin/python3")
    clean = {"PATH": DISTRO_PATH, "HOME": os.environ.get("HOME", "/root"), "NODE_ROOT": NO_NODE_ROOT,
             **(env or {})}
    argv = ["make", "--no-print-directory", "-C", str(ROOT), "-o", ".venv/.installed"]
    proc = subprocess.run(list(wrap) + argv + list(args),
                          env=clean, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=MAKE_TIMEOUT)
    return proc


class Install:
    """make install PREFIX=<tmp>/prefix SYSCONFDIR=<tmp>/etc."""

    def __init__(self, tmp: Path):
        self.prefix = tmp / "prefix"
        self.sysconfdir = tmp / "etc"
        self.lib = self.prefix / "lib" / "hami"
        self.venv = self.lib / "venv"
        self.bin = self.prefix / "bin"
        self.config = self.sysconfdir / "hami" / "config.toml"

    def make(self, target="install", wrap=(), args=()):
        proc = make(target, f"PREFIX={self.prefix}", f"SYSCONFDIR={self.sysconfdir}", *args, wrap=wrap)
        assert proc.returncode == 0, proc.stdout[-4000:]
        self.output = proc.stdout
        return proc.stdout

    def site_packages(self) -> Path:
        [site] = (self.venv / "lib").glob("python3.*/site-packages")
        return site


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    inst = Install(tmp_path_factory.mktemp("install"))
    inst.make()
    return inst


class InstalledNode(Node):
    """hami-runtime and hamictl of an install, with no env but HAMI_CONFIG and
    the simulator's state; the config names no libvgpu (the install's default)."""

    def __init__(self, tmp, rootfs, template, sim_root, runtime_cmd, hamictl_cmd):
        super().__init__(tmp, rootfs, template, sim_root)
        self.runtime_cmd, self.hamictl_cmd = list(runtime_cmd), list(hamictl_cmd)

    def write_config(self, **overrides):
        super().write_config(**overrides)
        lines = self.config.read_text().splitlines(keepends=True)
        self.config.write_text("".join(x for x in lines if not x.startswith("libvgpu =")))

    @property
    def env(self):
        return {"HAMI_CONFIG": str(self.config), "HAMI_SIM_STATE": str(self.sim_state / "gpu.state")}

    def runtime(self, *args, **kw):
        return super().runtime(*args, cmd=self.runtime_cmd, **kw)

    def hamictl(self, *args):
        return subprocess.run(self.hamictl_cmd + list(args), capture_output=True, text=True,
                              env=self.env, timeout=TIMEOUT)
