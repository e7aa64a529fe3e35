"""The region is the container's to write: a tenant that zeroes or forges the usage
counters of its processes gets no process past the limit. Each allocation checks the
counters, the process's own count, and what the driver shows the container's other
processes holding (NVML's per-process usage, asked at most every 100 ms and again
before refusing)."""
import pytest

from .conftest import MIB, release
from .test_shared_limit import wait_line

HOLD = 600 * MIB
LIMIT = "1024m"


def rewrite_counters(path, value):
    """What a tenant can do to its region: every slot's usage set to `value` bytes."""
    from hami_runtime.node import region
    with region.open(path, writable=True) as r:
        procs = r._struct().procs
        for i in range(region.MAX_PROCS):
            if procs[i].owner:
                procs[i].mem_used[0] = procs[i].ctx_used[0] = value


@pytest.mark.parametrize("value", [0, MIB], ids=["zeroed", "forged to 1 MiB"])
def test_rewritten_counters_let_no_second_process_past_the_limit(probe, value):
    holder = probe.start("link", "hold", "mem", HOLD, 60, CUDA_DEVICE_MEMORY_LIMIT=LIMIT)
    try:
        assert wait_line(holder, "held") == "held rc=0\n"
        rewrite_counters(probe.region, value)
        second = probe.run("link", "alloc", "mem", HOLD, shared=True, CUDA_DEVICE_MEMORY_LIMIT=LIMIT,
                           LIBCUDA_LOG_LEVEL=1)
    finally:
        release(holder)
    assert second.fields["rc"] == 2                  # CUDA_ERROR_OUT_OF_MEMORY
    assert "the region was written; the driver's figure holds" in second.stderr


def test_honest_counters_still_let_the_slice_be_filled(probe):
    """The driver's figure is a floor, not a second charge: two processes still share
    the limit (two contexts of 300 MiB and 200 MiB each in 1024 MiB)."""
    holder = probe.start("link", "hold", "mem", 200 * MIB, 60, CUDA_DEVICE_MEMORY_LIMIT=LIMIT)
    try:
        assert wait_line(holder, "held") == "held rc=0\n"
        second = probe.run("link", "alloc", "mem", 200 * MIB, shared=True, CUDA_DEVICE_MEMORY_LIMIT=LIMIT)
    finally:
        release(holder)
    assert second.fields["rc"] == 0 and "region was written" not in second.stderr
