"""NVIDIA's CUDA runtime (libcudart.so.12 of the nvidia-cuda-runtime-cu12 wheel) unchanged
on the simulated driver, bare and under libvgpu: programs/cudart_probe.c, built as nvcc
would build it (its kernel a PTX fat binary registered at start-up), reports what it saw."""
import json
import subprocess

import pytest

from tests.clients.conftest import BUILD, ROOT

PROBE = BUILD / "clients" / "cudart_probe"
MEMORY_ALLOCATION = 2      # cudaErrorMemoryAllocation


@pytest.fixture(scope="module")
def probe():
    subprocess.run(["make", "-s", "-C", str(ROOT), str(PROBE.relative_to(ROOT))], check=True, timeout=300)
    return PROBE


@pytest.fixture
def out(client, probe):
    proc = subprocess.run([str(probe)], env=client.base_env, capture_output=True, text=True, timeout=120,
                          cwd=client.tmp)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_sees_one_device_of_the_granted_size(client, out):
    assert (out["count_rc"], out["count"]) == (0, 1)
    assert out["info_rc"] == 0
    assert out["total_mib"] == client.total_mib
    assert 0 < out["free_mib"] < out["total_mib"]


def test_copies_round_trip(out):
    assert out["copy_rc"] == 0 and out["copy_ok"]


def test_registered_kernel_launches_through_its_stub(out):
    assert out["launch_rc"] == 0
    assert out["sync_rc"] == 0
    assert out["missing_rc"] != 0      # a stub whose kernel the fat binary lacks


@pytest.mark.parametrize("kind", ["malloc", "async"])
def test_allocations_fill_to_the_limit_and_are_refused_past_it(out, kind):
    free, filled, chunk = out[f"{kind}_free_mib"], out[f"{kind}_mib"], out["chunk_mib"]
    assert free - chunk < filled <= free
    assert out[f"{kind}_fail"] == MEMORY_ALLOCATION
    if kind == "async":
        assert out["stream_rc"] == 0 and out["async_sync_rc"] == 0
