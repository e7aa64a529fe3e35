"""Fixtures for libvgpu's tests: the probe program on the simulated driver, with or
without libvgpu preloaded, each test on its own simulated machine (state file)."""
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import BUILD, LIBVGPU, ROOT, SIM_LIB, runtime_made

PROBE = BUILD / "tests" / "vgpu_probe"
MIB = 1 << 20
SKIP_EXIT = 77  # the probe's "the driver lacks an entry point" status


def parse_fields(text):
    """`key=value` pairs of every line of the probe's output (integers)."""
    out = {}
    for token in text.split():
        if "=" in token:
            key, value = token.split("=", 1)
            try:
                out[key] = int(value)
            except ValueError:
                out[key] = value
    return out


class Probe:
    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.region = tmp_path / "vgpu.region"
        self.limits = tmp_path / "limits"
        self.prefix = []  # runtime_files(): run as a runtime-made container's process
        self.base_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LD_LIBRARY_PATH": str(SIM_LIB),
            "HAMI_SIM_STATE": str(tmp_path / "sim.state"),
        }

    def env(self, preload=True, shared=False, **extra):
        env = dict(self.base_env)
        if preload:
            env["LD_PRELOAD"] = str(LIBVGPU)
        if shared:
            env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = str(self.region)
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def runtime_files(self, devices, core_policy="default", priority=1, boards=None):
        """Limits and a region made as the runtime makes them; from now on the probe
        runs as a process of a runtime-made container finds them (their fixed paths,
        in a mount namespace of its own), so the env's limits no longer count.
        Returns the writable limits, as hamictl update changes them."""
        from hami_runtime.node import region
        region.create_limits(self.limits, devices, core_policy, priority)
        region.create_region(self.region)
        self.prefix = runtime_made(self.limits, self.tmp, boards)
        return region.open_limits(self.limits, writable=True)

    def uuids(self):
        return self.run("link", "uuids", preload=False).stdout.split()

    def run(self, *args, preload=True, shared=False, timeout=30, check=True, **extra):
        proc = subprocess.run(self.prefix + [str(PROBE), *map(str, args)], env=self.env(preload, shared, **extra),
                              capture_output=True, text=True, timeout=timeout)
        if proc.returncode == SKIP_EXIT:
            pytest.skip(f"simulated driver: {proc.stdout.strip()}")
        if check and proc.returncode != 0:
            raise AssertionError(f"probe {args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        proc.fields = parse_fields(proc.stdout)
        return proc

    def start(self, *args, preload=True, shared=True, **extra):
        """A background probe; `hold` lets go when its stdin is closed (`release`)."""
        return subprocess.Popen(self.prefix + [str(PROBE), *map(str, args)],
                                env=self.env(preload, shared, **extra),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def context_bytes(self):
        """What a primary context takes on the driver, measured without libvgpu."""
        return self.run("link", "ctx", preload=False).fields["ctx"]


@pytest.fixture(scope="session")
def built():
    """libvgpu, the simulated driver and the probe, built when missing."""
    needed = (PROBE, LIBVGPU, SIM_LIB / "libcuda.so.1", SIM_LIB / "libnvidia-ml.so.1")
    if not all(p.exists() for p in needed):
        subprocess.run(["make", "-s", "-C", str(ROOT), "build", "sim", "libvgpu-tests"],
                       check=True, timeout=300)
    return True


@pytest.fixture
def probe(built, tmp_path):
    return Probe(tmp_path)


def release(proc, timeout=20):
    """Lets a holding probe free its memory and exit normally; kills it if it does not."""
    try:
        proc.stdin.close()
        proc.wait(timeout=timeout)
    finally:
        proc.kill()
        proc.wait(timeout=timeout)
