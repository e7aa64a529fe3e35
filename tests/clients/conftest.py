"""Real CUDA clients (nvidia-ml-py, cuda-bindings, numba-cuda, CuPy, libcudart) on the
simulated driver, each run bare and under libvgpu.

Every test gets its own simulated machine: one card of CARD_MIB, a private state
file, and (under libvgpu) a private region with a LIMIT_MIB limit. A client program
(programs/<name>.py) runs in a fresh interpreter, as the preload must be in place
before the driver is loaded, and prints one JSON object as its last line."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import BUILD, LIBVGPU, ROOT, SIM_LIB

PROGRAMS = Path(__file__).resolve().parent / "programs"
CLIENTS_CU13 = BUILD / "clients" / "cu13"
CARD_MIB = 4096
LIMIT_MIB = 1024
MODES = ("bare", "libvgpu")


class Client:
    """Runs client programs on one simulated machine, bare or under libvgpu."""

    def __init__(self, tmp_path: Path, mode: str):
        self.mode = mode
        self.vgpu = mode == "libvgpu"
        self.tmp = tmp_path
        config = tmp_path / "sim.conf"
        config.write_text(f"devices = 1\nmemory_mib = {CARD_MIB}\n")
        self.base_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(tmp_path),
            "LD_LIBRARY_PATH": str(SIM_LIB),
            "HAMI_SIM_CONFIG": str(config),
            "HAMI_SIM_STATE": str(tmp_path / "sim.state"),
            "PYTHONDONTWRITEBYTECODE": "1",
            # the clients' own caches stay inside the test's directory
            "CUPY_CACHE_DIR": str(tmp_path / "cupy-cache"),
            "NUMBA_CACHE_DIR": str(tmp_path / "numba-cache"),
        }
        if self.vgpu:
            self.base_env.update({
                "LD_PRELOAD": str(LIBVGPU),
                "CUDA_DEVICE_MEMORY_LIMIT": f"{LIMIT_MIB}m",
                "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(tmp_path / "vgpu.region"),
            })

    @property
    def total_mib(self) -> int:
        """The card the client should see: the limit under libvgpu, else the card."""
        return LIMIT_MIB if self.vgpu else CARD_MIB

    def command(self, program: str, *args, cu13: bool = False, env=None):
        environ = dict(self.base_env)
        if cu13:
            environ["PYTHONPATH"] = str(CLIENTS_CU13)
        environ.update(env or {})
        argv = [sys.executable, str(PROGRAMS / f"{program}.py"), *map(str, args)]
        return argv, environ

    def run(self, program: str, *args, cu13: bool = False, env=None, timeout: int = 180) -> dict:
        """The program's JSON result; fails the test on a non-zero exit or a hang."""
        argv, environ = self.command(program, *args, cu13=cu13, env=env)
        proc = subprocess.run(argv, env=environ, capture_output=True, text=True,
                              timeout=timeout, cwd=self.tmp)
        if proc.returncode != 0:
            raise AssertionError(f"{program} {args} ({self.mode}) exited {proc.returncode}:\n"
                                 f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def start(self, program: str, *args, cu13: bool = False, env=None) -> subprocess.Popen:
        """A program in the background (it may wait on its stdin), for several processes at once."""
        argv, environ = self.command(program, *args, cu13=cu13, env=env)
        return subprocess.Popen(argv, env=environ, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=self.tmp)


def finish(proc: subprocess.Popen) -> dict:
    """Lets a holding program (Client.start) go on and returns its JSON result."""
    proc.stdin.write("\n")
    proc.stdin.flush()
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-4000:]
    return json.loads(out.strip().splitlines()[-1])


def check_two_processes_share_one_limit(tmp_path: Path, program: str, refused: dict, held_mib: int = 128):
    """Two processes of `program hold` under one libvgpu limit: the first holds held_mib, the
    second fills what is left and exits, then the first fills. Both are refused as `refused`."""
    client = Client(tmp_path, "libvgpu")
    procs = []
    try:
        for mib in (held_mib, 0):
            procs.append(client.start(program, "hold", mib))
            assert json.loads(procs[-1].stdout.readline()) == {"holding_mib": mib}
        second = finish(procs[1])
        first = finish(procs[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert first["refusal"] == second["refusal"] == refused
    assert 0 < second["filled_mib"] <= LIMIT_MIB - held_mib
    # both processes' memory together stays under the one limit
    assert held_mib + second["filled_mib"] <= LIMIT_MIB
    # once the second has exited, its share is the first's to take, still within the limit
    assert second["filled_mib"] <= first["filled_mib"] <= LIMIT_MIB - held_mib


@pytest.fixture(scope="session")
def clients_built():
    """libvgpu, the simulated driver and the 13.x bindings, made when missing."""
    needed = (LIBVGPU, SIM_LIB / "libcuda.so.1", SIM_LIB / "libnvidia-ml.so.1",
              CLIENTS_CU13 / ".installed")
    if not all(p.exists() for p in needed):
        subprocess.run(["make", "-s", "-C", str(ROOT), "build", "sim", "clients"], check=True, timeout=900)
    return True


@pytest.fixture(params=MODES)
def client(request, clients_built, tmp_path):
    return Client(tmp_path, request.param)
