"""CuPy (cupy-cuda12x, on the wheels' libcudart and NVRTC) on the simulated driver: what a
user sees bare and under libvgpu (the card, its memory, copies, CuPy's out-of-memory error
from its default pool and from the stream-ordered pool, an elementwise kernel), and two
processes sharing one limit."""
import json

from tests.clients.conftest import LIMIT_MIB, Client

CHUNK_MIB = 64            # programs/cupy_client.py allocates in these
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


def finish(proc) -> dict:
    """Lets a holding process go on and returns its result."""
    proc.stdin.write("\n")
    proc.stdin.flush()
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-4000:]
    return json.loads(out.strip().splitlines()[-1])


def test_two_processes_share_one_limit(tmp_path):
    client = Client(tmp_path, "libvgpu")
    held_mib = 128
    procs = []
    try:
        for mib in (held_mib, 0):
            procs.append(client.start("cupy_client", "hold", mib))
            assert json.loads(procs[-1].stdout.readline()) == {"holding_mib": mib}
        # the second process fills what the first left and exits; then the first fills
        second = finish(procs[1])
        first = finish(procs[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert first["refusal"] == second["refusal"] == REFUSED
    assert 0 < second["filled_mib"] <= LIMIT_MIB - held_mib
    assert held_mib + second["filled_mib"] <= LIMIT_MIB
    assert second["filled_mib"] <= first["filled_mib"] <= LIMIT_MIB - held_mib
