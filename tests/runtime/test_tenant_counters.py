"""The tenant rewrites the usage counters of its own region from inside the container
(root, the engines' default capabilities): zeroed or forged, with one process or two,
the slice holds, and the process that would pass it is told why on stderr."""
import pytest

from hami_runtime.node import region

from .node import CUDA_ALLOC
from .test_tenant import SLICE, tenant_bundle

pytestmark = pytest.mark.skipif(not CUDA_ALLOC.exists(), reason="make sim builds the test program")


def rewrite(value: int, slots: int = 2) -> str:
    """Shell that writes `value` (one byte; the rest zero) over the device-0 usage
    counters of the first slots of the container's region, with busybox dd."""
    slot = region.ffi.sizeof("struct hami_proc_slot")
    base = region.ffi.offsetof("struct hami_region", "procs")
    fields = [region.ffi.offsetof("struct hami_proc_slot", f) for f in ("mem_used", "ctx_used")]
    writes = [f"printf '\\{value:03o}\\0\\0\\0\\0\\0\\0\\0' | dd of=$CUDA_DEVICE_MEMORY_SHARED_CACHE bs=1 "
              f"seek={base + i * slot + f} count=8 conv=notrunc 2>/dev/null" for i in range(slots) for f in fields]
    return "; ".join(writes)


# a context takes 300 MiB of the 1024 on the simulated card: 600 fits once, not twice.
# (script, what cuda_alloc prints, whether the refusal names the rewritten region)
CASES = {
    # one process holds 600, the counters are rewritten, it asks for 600 more: its own count holds
    "one process": ("cuda_alloc 600 @/tmp/go 600 > /tmp/first & {held}; {rewrite}; touch /tmp/go; wait; cat /tmp/first",
                    ["alloc 600 0", "alloc 600 2"], False),
    # the first holds 600 until told, a second asks for 600 after the rewrite: the driver's figure holds
    "two processes": ("cuda_alloc 600 @/tmp/go > /tmp/first & {held}; {rewrite}; cuda_alloc 600; touch /tmp/go; wait; "
                      "cat /tmp/first",
                      ["alloc 600 0", "alloc 600 2"], True),
}
VALUES = {"zeroed": 0, "forged to 1 byte": 1}
# until the first process says it holds its first 600 MiB (at most 20 s)
HELD = "i=0; until grep -q alloc /tmp/first || [ $i -gt 400 ]; do sleep 0.05; i=$((i+1)); done"


@pytest.mark.parametrize("value", VALUES.values(), ids=VALUES.keys())
@pytest.mark.parametrize("script,expected,says_why", CASES.values(), ids=CASES.keys())
def test_rewritten_counters_never_lift_the_slice(node, script, expected, says_why, value):
    # the rootfs is shared by the session's containers: no marker left by an earlier one
    script = "rm -f /tmp/go /tmp/first; " + script.format(held=HELD, rewrite=rewrite(value))
    bundle = tenant_bundle(node, "t", SLICE, script)
    proc = node.runtime("run", "--bundle", str(bundle), "t")
    got = [line for line in proc.stdout.splitlines() if line.startswith(("alloc ", "init "))]
    assert sorted(got) == sorted(expected), proc.stdout + proc.stderr
    if says_why:
        assert "the region was written; the driver's figure holds" in proc.stderr, proc.stderr
    assert node.containers() == []
