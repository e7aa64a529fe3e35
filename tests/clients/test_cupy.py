"""CuPy (cupy-cuda12x, on the wheels' libcudart and NVRTC) on the simulated driver: what a
user sees bare and under libvgpu (the card, its memory, copies, CuPy's out-of-memory error
from its default pool and from the stream-ordered pool, an elementwise kernel), and two
processes sharing one limit."""
from tests.clients.conftest import check_two_processes_share_one_limit

CHUNK_MIB = 64            # programs/scenarios.py allocates in these
REFUSED = {"error": "OutOfMemoryError"}


def test_device_memory_copies_and_a_kernel(client):
    out = client.run("cupy_client", "basic")
    assert out["count"] == 1
    assert out["total_mib"] == client.total_mib
    assert 0 < out["free_mib"] < out["total_mib"]
    assert out["round_trip"]
    assert out["kernel_shape"] == [1 << 20]
    for pool in ("pool", "async"):
        free, filled = out[f"{pool}_free_mib"], out[f"{pool}_filled_mib"]
        assert free - CHUNK_MIB < filled <= free, (pool, free, filled)
        assert out[f"{pool}_refusal"] == REFUSED
    assert out["pool_held_mib"] >= out["pool_filled_mib"]
    assert out["pool_released"]


def test_two_processes_share_one_limit(tmp_path):
    check_two_processes_share_one_limit(tmp_path, "cupy_client", REFUSED)
