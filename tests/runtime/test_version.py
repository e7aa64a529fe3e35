"""hami-runtime --version: its own version, then the lines of the runc it
wraps (tools that parse runc's read its "runc version" line); no subcommand
runs, as with runc. hami-runtime --help (-h, help, no argument): a few lines
of its own, then runc's help. hamictl --version: the same version."""
import re
import subprocess

import pytest

from tests.conftest import ROOT
from .node import HAMICTL, LAUNCHER, RUNC, RUNTIME, TIMEOUT

VERSION = re.search(r'^version\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
RUNC_LINES = subprocess.run([RUNC, "--version"], capture_output=True, text=True, check=True,
                            timeout=TIMEOUT).stdout.splitlines()
RUNC_HELP = subprocess.run([RUNC, "--help"], capture_output=True, text=True, check=True,
                           timeout=TIMEOUT).stdout
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


@pytest.mark.parametrize("front", sorted(FRONTS))
@pytest.mark.parametrize("args", [["--help"], ["-h"], ["help"], ["h"], [], ["--help=true"],
                                  ["--debug", "-h"], ["--help", "create"]])
def test_runtime_help_then_runcs(node, front, args):
    if front == "launcher" and not LAUNCHER.exists():
        pytest.skip("make build makes the launcher")
    proc = subprocess.run(FRONTS[front] + args, capture_output=True, text=True, env=node.env,
                          timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    ours, runcs = proc.stdout.split("\n\n", 1)
    assert runcs == RUNC_HELP
    lines = ours.splitlines()
    assert lines[0].startswith(f"hami-runtime version {VERSION}: a runc-compatible OCI runtime")
    assert "Its commands and flags are runc's" in lines[1]
    assert f"config: {node.config} (HAMI_CONFIG names it)" in lines
    assert lines[-1].endswith("hamictl --help") and len(lines) <= 8


@pytest.mark.parametrize("front", sorted(FRONTS))
@pytest.mark.parametrize("args", [["help", "create"], ["help", "list"], ["--help=false", "help", "list"],
                                  ["create", "--help"], ["run", "-h"], ["delete", "--help"]])
def test_command_help_is_runcs_alone(node, front, args):
    if front == "launcher" and not LAUNCHER.exists():
        pytest.skip("make build makes the launcher")
    proc = subprocess.run(FRONTS[front] + args, capture_output=True, text=True, env=node.env,
                          timeout=TIMEOUT)
    runcs = subprocess.run([RUNC] + args, capture_output=True, text=True, timeout=TIMEOUT)
    assert (proc.returncode, proc.stdout) == (runcs.returncode, runcs.stdout)
    assert "hami-runtime" not in proc.stdout


def test_help_names_the_default_config(monkeypatch):
    from hami_runtime.version import help_lines
    assert "config: /etc/hami/config.toml (HAMI_CONFIG, where set, names another)" in \
        help_lines("/etc/hami/config.toml", False)


def test_hamictl_version():
    proc = subprocess.run(HAMICTL + ["--version"], capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0 and proc.stdout == f"hamictl version {VERSION}\n"
