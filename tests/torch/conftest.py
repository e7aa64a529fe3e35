"""PyTorch's CUDA 13 stack on the simulated driver, bare and under libvgpu.

PyTorch lives in an environment of its own (make torch: build/torch/venv, pinned by
tests/torch/requirements.txt), made here when it is missing so that these tests never
skip on a fresh machine. Every test gets its own simulated machine: a private state file
and a config of its own (one card, CUDA 13 driver). The workload is
bench/gpu/torch_probe.py, the program that measures PyTorch on a real GPU too; it runs
in a fresh interpreter per measurement and prints one JSON object as its last line."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import BUILD, LIBVGPU, ROOT, SIM_LIB

TORCH_VENV = BUILD / "torch" / "venv"
TORCH_PYTHON = TORCH_VENV / "bin" / "python"
PROBE = ROOT / "bench" / "gpu" / "torch_probe.py"
CUDA_VERSION = 13000          # the driver torch's CUDA 13 build needs
MIB = 1 << 20


def sim_config(path: Path, card_mib: int, kernel_us: int = 10) -> Path:
    path.write_text(f"devices = 1\nmemory_mib = {card_mib}\ncuda_version = {CUDA_VERSION}\nkernel_us = {kernel_us}\n")
    return path


class TorchMachine:
    """One simulated card of card_mib; with limit_mib, libvgpu preloaded with that env limit."""

    def __init__(self, tmp: Path, card_mib: int, limit_mib: int = 0, kernel_us: int = 10, env=None):
        self.tmp = tmp
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(tmp),
            "LD_LIBRARY_PATH": str(SIM_LIB),
            "HAMI_SIM_CONFIG": str(sim_config(tmp / "sim.conf", card_mib, kernel_us)),
            "HAMI_SIM_STATE": str(tmp / "sim.state"),
            "PYTHONDONTWRITEBYTECODE": "1",
            **(env or {}),
        }
        if limit_mib:
            self.env.update({"LD_PRELOAD": str(LIBVGPU), "CUDA_DEVICE_MEMORY_LIMIT": f"{limit_mib}m",
                             "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(tmp / "vgpu.region")})

    def argv(self, *args):
        return [str(TORCH_PYTHON), str(PROBE), *map(str, args)]

    def run(self, *args, env=None, timeout: int = 300) -> dict:
        """The probe's JSON result; fails the test on a non-zero exit or a hang."""
        proc = subprocess.run(self.argv(*args), env={**self.env, **(env or {})}, capture_output=True, text=True,
                              timeout=timeout, cwd=self.tmp)
        assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def torch_env():
    """build/torch/venv, installed by make (a few minutes on a fresh machine) when missing."""
    needed = (TORCH_VENV / ".installed", LIBVGPU, SIM_LIB / "libcuda.so.1")
    if not all(p.exists() for p in needed):
        subprocess.run(["make", "-s", "-C", str(ROOT), "torch", "build", "sim"], check=True, timeout=3600)
    return TORCH_PYTHON
