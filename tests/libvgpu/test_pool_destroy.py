"""A pool destroyed with allocations outstanding keeps its memory in the driver until
the last of them is freed; the container stays charged for it until then."""
import pytest

from .conftest import MIB

LIMIT = 1024 * MIB
BLOCK = 150 * MIB  # two blocks: the pool reserves 320 MiB (32 MiB granules)
OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY


@pytest.mark.parametrize("free", ["async", "sync"])
def test_destroyed_pool_stays_charged_until_its_last_allocation_is_freed(probe, free):
    ctx = probe.context_bytes()
    # fits beside the context alone; not beside the pool's 320 MiB, nor beside the
    # one block the driver still holds once the other is freed
    big = LIMIT - ctx - 100 * MIB
    result = probe.run("link", "pooldestroy", free, BLOCK, big, CUDA_DEVICE_MEMORY_LIMIT=LIMIT,
                       LIBCUDA_LOG_LEVEL=3)
    fields = result.fields
    assert fields["destroy_rc"] == 0, result.stdout
    assert fields["during_rc"] == OOM, result.stdout
    assert fields["mid_rc"] == OOM, result.stdout
    assert fields["after_rc"] == 0, result.stdout
    # charged by the hooks as the driver holds it, not caught up after the fact
    assert "past the hooks" not in result.stderr, result.stderr


def test_destroying_an_idle_pool_gives_its_memory_back_at_once(probe):
    ctx = probe.context_bytes()
    big = LIMIT - ctx - 100 * MIB
    result = probe.run("link", "pooldestroy", "before", BLOCK, big, CUDA_DEVICE_MEMORY_LIMIT=LIMIT)
    assert result.fields["destroy_rc"] == 0, result.stdout
    assert result.fields["during_rc"] == 0, result.stdout
    assert result.fields["after_rc"] == 0, result.stdout


def test_driver_agrees_a_destroyed_pool_holds_memory(probe):
    """The same scenario without libvgpu: the simulated driver itself refuses, so the
    charge above follows the driver rather than being stricter than it."""
    ctx = probe.context_bytes()
    total = 16384 * MIB
    big = total - ctx - 100 * MIB
    result = probe.run("link", "pooldestroy", "async", BLOCK, big, preload=False)
    assert result.fields["during_rc"] == OOM, result.stdout
    assert result.fields["after_rc"] == 0, result.stdout
