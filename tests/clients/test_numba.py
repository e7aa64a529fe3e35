"""numba-cuda on the simulated driver: what a user sees bare and under libvgpu (the
card, its memory, numba's own out-of-memory error, a @cuda.jit kernel), the SM limit
slowing its launches, and two processes sharing one limit."""
from pathlib import Path

import pytest

from tests.clients.conftest import Client, check_two_processes_share_one_limit

CHUNK_MIB = 64            # programs/scenarios.py allocates in these
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
    limited = launch_seconds(tmp_path / "limited", CUDA_DEVICE_SM_LIMIT=str(SM_LIMIT),
                             GPU_CORE_UTILIZATION_POLICY="force")  # `default` would lend it the idle GPU
    busy = LAUNCHES * KERNEL_US / 1e6
    assert unlimited >= 0.8 * busy, f"{unlimited:.2f} s for {busy:.2f} s of kernels"
    # at a quarter of the SM the same work takes about four times as long: at least
    # half of that, and clearly longer than unlimited however loaded the machine is
    assert limited >= 0.5 * busy * 100 / SM_LIMIT, f"limited {limited:.2f} s for {busy:.2f} s of kernels"
    assert limited > 1.5 * unlimited, f"limited {limited:.2f} s, unlimited {unlimited:.2f} s"


def test_two_processes_share_one_limit(tmp_path):
    check_two_processes_share_one_limit(tmp_path, "numba_client", {"error": "CudaAPIError", "code": OUT_OF_MEMORY})
