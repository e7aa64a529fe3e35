"""Launches reach the SM limiter whichever way the program found cuLaunchKernel."""
import pytest

from .conftest import release
from .test_shared_limit import wait_line

MODES = ["link", "dlsym", "proc", "proc_ptsz"]


@pytest.mark.parametrize("mode", MODES)
def test_every_way_of_launching_is_seen(probe, mode):
    from hami_runtime.node import region

    launcher = probe.start(mode, "launch", 20, 60, CUDA_DEVICE_SM_LIMIT=90)
    try:
        assert wait_line(launcher, "rc=") == "rc=0\n"
        with region.open(probe.region) as r:
            # counted in its slot while it runs (an exited process gives its slot back)
            launches = sum(p.devices[0].launches for p in r.processes(1))
    finally:
        release(launcher)
    assert launches == 20


@pytest.mark.parametrize("mode", MODES)
def test_launch_without_limit_is_passed_through(probe, mode):
    assert probe.run(mode, "launch", 20).fields["rc"] == 0
