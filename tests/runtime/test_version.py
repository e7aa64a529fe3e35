"""hami-runtime --version: its own version, then the lines of the runc it
wraps (tools that parse runc's read its "runc version" line); no subcommand
runs, as with runc. hamictl --version: the same version."""
import re
import subprocess

import pytest

from tests.conftest import ROOT
from .node import HAMICTL, LAUNCHER, RUNC, RUNTIME, TIMEOUT

VERSION = re.search(r'^version\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
RUNC_LINES = subprocess.run([RUNC, "--version"], capture_output=True, text=True, check=True,
                            timeout=TIMEOUT).stdout.splitlines()
FRONTS = {"launcher": [str(LAUNCHER)], "python": RUNTIME}


@pytest.mark.parametrize("front", sorted(FRONTS))
@pytest.mark.parametrize("flag", ["--version", "-v", "-version", "--version=true", "-v=1"])
def test_runtime_version_then_runcs(node, front, flag):
    if front == "launcher" and not LAUNCHER.exists():
        pytest.skip("make build makes the launcher")
    proc = subprocess.run(FRONTS[front] + [flag], capture_output=True, text=True, env=node.env,
                          timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"hami-runtime version {VERSION}"] + RUNC_LINES
    # what docker and others parse: the last line that says "version" is runc's
    assert [x for x in proc.stdout.splitlines() if "version" in x][-1] == RUNC_LINES[0]


@pytest.mark.parametrize("front", sorted(FRONTS))
def test_version_before_a_create_creates_nothing(node, front):
    """runc prints its version and runs no subcommand; so do we: no allocation."""
    if front == "launcher" and not LAUNCHER.exists():
        pytest.skip("make build makes the launcher")
    bundle = node.bundle("v", {"hami.io/gpumem": "10"})
    proc = node.runtime("--version", "create", "--bundle", str(bundle), "v", cmd=FRONTS[front])
    assert proc.returncode == 0 and proc.stdout.startswith(f"hami-runtime version {VERSION}\n")
    assert node.allocations() == {} and node.containers() == []


@pytest.mark.parametrize("value", ["false", "0", "F"])
def test_version_false_is_no_version(node, value):
    proc = subprocess.run(RUNTIME + [f"--version={value}", "--root", str(node.runc_root), "list"],
                          capture_output=True, text=True, env=node.env, timeout=TIMEOUT)
    assert proc.returncode == 0 and "version" not in proc.stdout and proc.stdout.startswith("ID")


def test_hamictl_version():
    proc = subprocess.run(HAMICTL + ["--version"], capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0 and proc.stdout == f"hamictl version {VERSION}\n"
