"""Launches reach the SM limiter whichever way the program found cuLaunchKernel."""
import pytest

MODES = ["link", "dlsym", "proc", "proc_ptsz"]


@pytest.mark.parametrize("mode", MODES)
def test_every_way_of_launching_is_seen(probe, mode):
    from hami_runtime import region

    result = probe.run(mode, "launch", 20, shared=True, CUDA_DEVICE_SM_LIMIT=90)
    assert result.fields["rc"] == 0
    with region.open(probe.region) as r:
        # the exited process keeps its slot until another process reclaims it
        launches = sum(p.devices[0].launches for p in r.processes())
    assert launches == 20


@pytest.mark.parametrize("mode", MODES)
def test_launch_without_limit_is_passed_through(probe, mode):
    assert probe.run(mode, "launch", 20).fields["rc"] == 0
