"""numba-cuda on the simulated driver: what a user sees bare and under libvgpu (the
card, its memory, numba's own out-of-memory error, a @cuda.jit kernel), the SM limit
slowing its launches, and two processes sharing one limit."""
import json
from pathlib import Path

import pytest

from tests.clients.conftest import LIMIT_MIB, Client

CHUNK_MIB = 64            # programs/numba_client.py allocates in these
OUT_OF_MEMORY = 2         # CUDA_ERROR_OUT_OF_MEMORY
KERNEL_US = 4000          # each kernel's simulated time
LAUNCHES = 100
SM_LIMIT = 25


@pytest.mark.parametrize("linker", [(), ("--driver-linker",)], ids=["nvjitlink", "driver-linker"])
def test_device_memory_and_a_kernel(client, linker):
    out = client.run("numba_client", *linker, "basic")
    assert out["detected"] and "1/1 devices are supported" in out["detect_report"]
    assert out["cc"] == [9, 0]
    assert out["total_mib"] == client.total_mib
    assert out["free_mib"] - CHUNK_MIB < out["filled_mib"] <= out["free_mib"]
    assert out["refusal"] == {"error": "CudaAPIError", "code": OUT_OF_MEMORY}
    assert out["launched"]


def launch_seconds(workdir: Path, **env) -> float:
    """Seconds for the launches in a fresh machine and region (the region keeps its first limit)."""
    workdir.mkdir()
    client = Client(workdir, "libvgpu")
    with open(workdir / "sim.conf", "a") as conf:  # a compiled kernel runs the configured time
        conf.write(f"kernel_us = {KERNEL_US}\n")
    out = client.run("numba_client", "launches", LAUNCHES, env=env)
    return out["seconds"]


def test_sm_limit_slows_launches(tmp_path):
    unlimited = launch_seconds(tmp_path / "unlimited")
    limited = launch_seconds(tmp_path / "limited", CUDA_DEVICE_SM_LIMIT=str(SM_LIMIT))
    busy = LAUNCHES * KERNEL_US / 1e6
    assert unlimited >= 0.8 * busy, f"{unlimited:.2f} s for {busy:.2f} s of kernels"
    # at a quarter of the SM the same work takes about four times as long: at least
    # half of that, and clearly longer than unlimited however loaded the machine is
    assert limited >= 0.5 * busy * 100 / SM_LIMIT, f"limited {limited:.2f} s for {busy:.2f} s of kernels"
    assert limited > 1.5 * unlimited, f"limited {limited:.2f} s, unlimited {unlimited:.2f} s"


def finish(proc) -> dict:
    """Lets a holding process go on and returns its result."""
    proc.stdin.write("\n")
    proc.stdin.flush()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-4000:]
    return json.loads(out.strip().splitlines()[-1])


def test_two_processes_share_one_limit(tmp_path):
    client = Client(tmp_path, "libvgpu")
    held_mib = 128
    procs = []
    try:
        for mib in (held_mib, 0):
            procs.append(client.start("numba_client", "hold", mib))
            assert json.loads(procs[-1].stdout.readline()) == {"holding_mib": mib}
        # the second process fills what the first left and exits; then the first fills
        second = finish(procs[1])
        first = finish(procs[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    refused = {"error": "CudaAPIError", "code": OUT_OF_MEMORY}
    assert first["refusal"] == second["refusal"] == refused
    assert 0 < second["filled_mib"] <= LIMIT_MIB - held_mib
    # both processes' memory together stays under the one limit
    assert held_mib + second["filled_mib"] <= LIMIT_MIB
    # once the second has exited, its share is the first's to take, still within the limit
    assert second["filled_mib"] <= first["filled_mib"] <= LIMIT_MIB - held_mib
