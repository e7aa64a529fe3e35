"""Fixtures for the engine tests: engines installed, a local image, hami-runtime
behind a wrapper, and daemons that each test module starts and stops itself.

Examples are used as they are; the only substitution is the install path of
hami-runtime (/usr/local/bin/hami-runtime) which becomes a wrapper script that
sets HAMI_CONFIG to this session's config and execs the venv's hami-runtime.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional

import pytest

from tests.conftest import LIBVGPU, ROOT, SIM

INSTALLED_RUNTIME = "/usr/local/bin/hami-runtime"
VENV_BIN = Path(sys.executable).parent
IMAGE = "hami-probe:latest"
PROBE = "/usr/local/bin/vgpu-probe"
MiB = 1024 * 1024


def run(cmd, timeout=120, check=False, **kwargs) -> subprocess.CompletedProcess:
    """A bounded command; output captured as text."""
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                            timeout=timeout, **kwargs)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} -> {result.returncode}\n"
                             f"{result.stdout}\n{result.stderr}")
    return result


def wait_for(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def filled_to_the_limit(out: str, limit_mib: int) -> int:
    """Checks the output of `vgpu-probe fill` under a limit of limit_mib: it filled
    the device to what cuMemGetInfo called free (less at most 2 MiB of rounding)
    and the next MiB was refused as out of memory. Returns the MiB it got."""
    free = int(re.search(rf"total {limit_mib} MiB, free (\d+) MiB before filling", out).group(1))
    got = int(re.search(r"allocated (\d+) MiB; the next 1 MiB was refused: "
                        r"CUDA_ERROR_OUT_OF_MEMORY", out).group(1))
    assert free - 2 <= got <= free
    return got


# ---- engines -------------------------------------------------------------------

@pytest.fixture(scope="session")
def engines_installed() -> str:
    """Runs scripts/install-engines.sh once; returns its failure text ("" when fine)."""
    try:
        result = run(["bash", ROOT / "scripts" / "install-engines.sh"], timeout=900)
    except subprocess.TimeoutExpired:
        return "scripts/install-engines.sh took over 900 s"
    if result.returncode != 0:
        return f"scripts/install-engines.sh failed: {(result.stdout + result.stderr).strip()[-300:]}"
    return ""


def need(binary: str, install_problem: str) -> str:
    path = shutil.which(binary, path="/usr/sbin:/usr/bin:/sbin:/bin")
    if path is None:
        pytest.skip(f"{binary} is not installed here ({install_problem or 'package not found'})")
    return path


# ---- the runtime under test -----------------------------------------------------

@dataclass
class Hami:
    config: Path
    state_dir: Path
    wrapper: Path
    log: Path

    def render(self, example: str, target: Path) -> Path:
        """Copies examples/<example> to target, only the install path replaced."""
        text = (ROOT / "examples" / example).read_text()
        assert INSTALLED_RUNTIME in text or example.endswith(("yml", "yaml")), example
        target.write_text(text.replace(INSTALLED_RUNTIME, str(self.wrapper)))
        return target

    def allocations(self) -> dict:
        """container id -> allocation entry, as the allocator's state file has it now."""
        try:
            data = json.loads((self.state_dir / "allocations.json").read_text())
        except FileNotFoundError:
            return {}
        return {e["id"]: e for e in data.get("allocations", {}).values()}

    def devices(self) -> List[dict]:
        """The simulated GPUs (and MIG instances), as `hamictl gpus` lists them with this config."""
        shared = self.state_dir.parent / "sim-shared"
        env = {**os.environ, "HAMI_CONFIG": str(self.config), "HAMI_SIM_STATE": str(shared / "gpu.state")}
        if (shared / "sim.conf").exists():
            env["HAMI_SIM_CONFIG"] = str(shared / "sim.conf")
        listed = run([VENV_BIN / "hamictl", "gpus", "--json"], check=True, timeout=60, env=env)
        return json.loads(listed.stdout)

    def driver_let_go(self) -> None:
        """Waits until the simulated driver holds no memory for any process: one
        of a removed container counts until its heartbeat is stale (another pid
        namespace cannot be checked otherwise; tests/simgpu/sim_state.c), and a
        container filling its slice next would see its slice's free memory short."""
        wait_for(lambda: all(gpu["driver_memory_used_mib"] == 0 for gpu in self.devices()), 30,
                 "the driver to let go of a removed container's memory")

    def gpu_uuids(self) -> List[str]:
        return [gpu["uuid"] for gpu in self.devices()]

    def pods(self) -> dict:
        """The allocator's records of Kubernetes pods (pod_ledger.py), by key."""
        try:
            return json.loads((self.state_dir / "allocations.json").read_text()).get("pods", {})
        except FileNotFoundError:
            return {}

    def region_dirs(self) -> List[str]:
        """The container ids that have a region dir (named <id>@<runc root key>)."""
        base = self.state_dir / "containers"
        return sorted(n.rpartition("@")[0] for n in os.listdir(base)) if base.is_dir() else []

    def assert_nothing_allocated(self, pods_live: bool = False) -> None:
        """No allocation or region dir; and no pod record, unless a pod still lives
        (a removed pod's goes at the transaction of its sandbox's detached release)."""
        assert self.allocations() == {}
        assert self.region_dirs() == []
        if not pods_live:
            wait_for(lambda: self.pods() == {}, 15, "the removed pod's record to go")


def make_hami(root: Path, **sim) -> Hami:
    """A config for the simulated GPU with its own state and sim state under root;
    `sim`: keys of the simulated driver's config (tests/simgpu/README.md), for the
    runtime and the containers alike."""
    for needed in (LIBVGPU, SIM / "hami.toml", SIM / "lib" / "libcuda.so.1"):
        if not needed.exists():
            pytest.fail(f"{needed} is missing: run `make build sim` first")
    state_dir, sim_shared = root / "state", root / "sim-shared"
    state_dir.mkdir()
    sim_shared.mkdir()
    os.chmod(sim_shared, 0o1777)
    text = (SIM / "hami.toml").read_text()
    text, n_state = re.subn(r'(?m)^state_dir = .*$', f'state_dir = "{state_dir}"', text)
    text, n_shared = re.subn(r'(?m)^source = "[^"]*/shared"$', f'source = "{sim_shared}"', text)
    assert (n_state, n_shared) == (1, 1), "build/sim/hami.toml changed shape"
    sim_env = ""
    if sim:
        (sim_shared / "sim.conf").write_text("".join(f"{k} = {v}\n" for k, v in sim.items()))
        text = text.replace("[extra_env]\n", '[extra_env]\nHAMI_SIM_CONFIG = "/run/hami-sim/sim.conf"\n')
        sim_env = f'HAMI_SIM_CONFIG="{sim_shared / "sim.conf"}" '
    # The runtime's own log: what it did with each container (the pod tests read it).
    config = root / "hami.toml"
    config.write_text(f'log_file = "{root / "hami.log"}"\nlog_level = "info"\n' + text)
    wrapper = root / "bin" / "hami-runtime"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\n{sim_env}HAMI_CONFIG="{config}" exec "{VENV_BIN / "hami-runtime"}" "$@"\n')
    wrapper.chmod(0o755)
    return Hami(config=config, state_dir=state_dir, wrapper=wrapper, log=root / "hami.log")


@pytest.fixture(scope="session")
def hami(tmp_path_factory) -> Hami:
    return make_hami(tmp_path_factory.mktemp("hami"))


@pytest.fixture(scope="session")
def probe_image(tmp_path_factory) -> Path:
    """busybox + vgpu-probe + the glibc pieces the injected driver libraries need."""
    out = tmp_path_factory.mktemp("image")
    libs = [LIBVGPU, SIM / "lib" / "libcuda.so.1", SIM / "lib" / "libnvidia-ml.so.1",
            SIM / "bin" / "nvidia-smi"]
    args = [sys.executable, ROOT / "scripts" / "probe" / "build_image.py", out]
    for lib in libs:
        args += ["--lib-from", lib]
    run(args, check=True)
    return out


# ---- daemons ----------------------------------------------------------------------

def processes_mentioning(marker: str) -> List[int]:
    """Pids whose command line names `marker` (a unique temp root of ours)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry))
    return found


def unmount_under(root: Path) -> None:
    """Lazily unmounts whatever the engines left mounted under root (deepest first)."""
    mounts = []
    with open("/proc/self/mountinfo") as info:
        for line in info:
            point = line.split()[4].replace("\\040", " ")
            if point == str(root) or point.startswith(str(root) + "/"):
                mounts.append(point)
    for point in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, timeout=30)


class Daemon:
    """An engine daemon in its own process group with its own temp root."""

    def __init__(self, name: str, root: Path, argv: List[str], env: Optional[dict] = None):
        self.name, self.root, self.argv = name, root, [str(a) for a in argv]
        self.log = root / f"{name}.log"
        self.env = env
        self.proc: Optional[subprocess.Popen] = None

    def start(self, ready: Callable[[], bool], timeout: float = 60) -> "Daemon":
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         env=self.env)

        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited ({self.proc.returncode}):\n"
                                     f"{self.log_tail()}")
            return ready()
        try:
            wait_for(up, timeout, f"{self.name} to answer")
        except BaseException:
            self.stop()
            raise
        return self

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 30) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=timeout)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                pass
            try:  # what is left in the group (a managed containerd, say)
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)
        # Shims and conmon leave the group on purpose; they still name our root.
        marker = f"{self.root}/"
        for pid in processes_mentioning(marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_for(lambda: not processes_mentioning(marker), 15, f"{self.name}'s processes to exit")
        unmount_under(self.root)
