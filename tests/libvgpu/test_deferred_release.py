"""Memory the driver keeps after the call that gives it up returned: a pool destroyed
with allocations outstanding (kept until the last is freed), a VMM handle released
while mapped (kept until its last unmap), stream-ordered memory of a destroyed
context (it outlives the context). The container stays charged until then, and no
longer."""
import pytest

from .conftest import MIB

LIMIT = 1024 * MIB
PHYSICAL = 16384 * MIB
OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY
POOL_BLOCK = 150 * MIB  # two blocks: the pool reserves 320 MiB (32 MiB granules)
VMM_BYTES = 320 * MIB

# (probe command and mode, the rc of each step): a plain allocation that fits beside
# the context alone, but not beside what the driver still holds, is tried at each step
# ("mid": one of the pool's two blocks freed, the driver still holds the other).
CASES = [
    (("pooldestroy", "async", POOL_BLOCK), {"destroy_rc": 0, "during_rc": OOM, "mid_rc": OOM, "after_rc": 0}),
    (("pooldestroy", "sync", POOL_BLOCK), {"destroy_rc": 0, "during_rc": OOM, "mid_rc": OOM, "after_rc": 0}),
    (("pooldestroy", "before", POOL_BLOCK), {"destroy_rc": 0, "during_rc": 0, "after_rc": 0}),
    (("vmmrelease", "mapped", VMM_BYTES), {"release_rc": 0, "during_rc": OOM, "after_rc": 0}),
    (("vmmrelease", "unmapped", VMM_BYTES), {"release_rc": 0, "during_rc": 0, "after_rc": 0}),
    # the created context and its plain block go with it, the pool block stays
    (("ctxdestroy", POOL_BLOCK), {"destroy_rc": 0, "during_rc": OOM, "after_rc": 0}),
]
IDS = ["pool-free-async", "pool-free-sync", "pool-idle", "vmm-mapped", "vmm-unmapped",
       "ctx-destroyed"]


@pytest.mark.parametrize("args, expected", CASES, ids=IDS)
def test_charge_follows_what_the_driver_still_holds(probe, args, expected):
    ctx = probe.context_bytes()
    big = LIMIT - ctx - 100 * MIB
    result = probe.run("link", *args, big, CUDA_DEVICE_MEMORY_LIMIT=LIMIT, LIBCUDA_LOG_LEVEL=3)
    assert {k: result.fields[k] for k in expected} == expected, result.stdout
    # charged by the hooks as the driver holds it, not caught up after the fact
    assert "past the hooks" not in result.stderr, result.stderr


@pytest.mark.parametrize("args", [("pooldestroy", "async", POOL_BLOCK),
                                  ("vmmrelease", "mapped", VMM_BYTES),
                                  ("ctxdestroy", POOL_BLOCK)], ids=["pool", "vmm", "ctx"])
def test_the_driver_itself_still_holds_it(probe, args):
    """The same scenarios on the whole simulated device without libvgpu: the driver
    refuses too, so the charge above is not stricter than the driver."""
    ctx = probe.context_bytes()
    big = PHYSICAL - ctx - 100 * MIB
    result = probe.run("link", *args, big, preload=False)
    assert result.fields["during_rc"] == OOM, result.stdout
    assert result.fields["after_rc"] == 0, result.stdout
