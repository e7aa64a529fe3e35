"""End to end: a real runc container made by hami-runtime, in which a process
keeps allocating; `hamictl update --gpumem` raises its limit and the same
process, never restarted, gets further."""
import time

import pytest

from hami_runtime.lifecycle.node_state import state_layout
from hami_runtime.node import region

from .node import CUDA_ALLOC

MIB = 1 << 20


def held_mib(node, cid):
    name = state_layout.alloc_name(str(node.runc_root), cid)
    with region.Region(node.state_dir / "containers" / name / region.REGION_FILE_NAME) as reg:
        return reg.used_bytes(0) / MIB


def wait_for(check, seconds=30):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not CUDA_ALLOC.exists(), reason="make sim builds the test program")
def test_resize_reaches_a_process_that_keeps_allocating(node):
    bundle = node.bundle("grow", {"hami.io/gpumem": "1000"},
                         args=("cuda_alloc", "keep", "64", "60"))
    proc = node.runtime("run", "--detach", "--bundle", str(bundle), "grow")
    assert proc.returncode == 0, proc.stderr
    try:
        # It fills its 1000 MiB and is refused from then on.
        assert wait_for(lambda: held_mib(node, "grow") > 1000 - 2 * 64), held_mib(node, "grow")
        time.sleep(0.3)
        assert held_mib(node, "grow") <= 1000
        update = node.hamictl("update", "grow", "--gpumem", "2000")
        assert update.returncode == 0, update.stderr
        assert update.stdout.startswith("grow: GPU 0 ") and "memory 1000MiB -> 2000MiB" in update.stdout
        # The same process goes on to the new limit, and not past it.
        assert wait_for(lambda: held_mib(node, "grow") > 2000 - 2 * 64), held_mib(node, "grow")
        time.sleep(0.3)
        assert held_mib(node, "grow") <= 2000
        [row] = node.ps()
        assert (row["container"], row["memory_mib"]) == ("grow", 2000)
        # A shrink below what it holds is refused, and changes nothing.
        refused = node.hamictl("update", "grow", "--gpumem", "500")
        assert refused.returncode == 1 and "--force" in refused.stderr
        assert node.ps()[0]["memory_mib"] == 2000
    finally:
        assert node.runtime("delete", "--force", "grow").returncode == 0
    assert node.ps() == []
