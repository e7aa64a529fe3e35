"""cuda-bindings 12.x (the venv's) and 13.x (build/clients/cu13) on the simulated
driver, bare and under libvgpu: every context-creation form, the card's (or the
limit's) memory filled and refused past it, a stream-ordered allocation and a PTX
kernel launch; and cuda.core over each version."""
import pytest

CHUNK_MIB = 128   # programs/bindings.py allocates in these

VERSIONS = [
    # (major, on the 13.x path, the cuCtxCreate forms it offers)
    pytest.param(12, False, {"v2", "v3", "v4"}, id="12.x"),
    pytest.param(13, True, {"v4"}, id="13.x"),
]


@pytest.mark.parametrize("major, cu13, variants", VERSIONS)
def test_driver_api_through_the_bindings(client, major, cu13, variants):
    out = client.run("bindings", cu13=cu13)
    assert int(out["version"].split(".")[0]) == major

    contexts = out["contexts"]
    assert set(contexts) == variants | {"primary"}
    for name, seen in contexts.items():
        assert seen["current"] and seen["device"] == 0, (name, seen)
    assert contexts["primary"]["active"]

    assert out["total_mib"] == client.total_mib
    assert 0 < out["free_mib"] < out["total_mib"]
    # filled to what was free (in whole chunks), then refused as out of memory
    assert out["free_mib"] - CHUNK_MIB < out["filled_mib"] <= out["free_mib"]
    assert out["fill_error"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert out["past_total"] == "CUDA_ERROR_OUT_OF_MEMORY"

    assert out["async_ok"]
    assert out["async_past_total"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert out["launched"]


@pytest.mark.parametrize("major, cu13, variants", VERSIONS)
def test_cuda_core_over_the_bindings(client, major, cu13, variants):
    out = client.run("bindings_core", cu13=cu13)
    assert out["cc"] == [9, 0] and out["sms"] > 0
    # stream-ordered buffers from the device's pool, until refused within the card or limit
    assert 0 < out["allocated_mib"] < client.total_mib
    assert out["refused"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert out["kernel_ms"] > 0
    assert out["max_threads"] == 1024 and out["blocks_per_sm"] > 0
