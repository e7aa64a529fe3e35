"""The region's SM counters as libvgpu keeps them on the simulated GPU: a
container held to its SM share counts the time its launches waited in
sm[dev].throttled_ns and its kernel time in busy_ns; one with no limit in force
costs its launches nothing, so both stay 0; none is paused.

Three containers run side by side for the same window on one simulated device
(sm_load.measure). Timed on a shared machine: direction and coarse bounds only."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sm_load  # noqa: E402
from sm_load import Load  # noqa: E402

from hami_runtime.node import region  # noqa: E402

SECONDS = 2
WARMUP_S = 1.0

# (name, SM limit, policy, held): whether launches wait for the share
CONTAINERS = [
    ("force30", 30, "force", True),
    ("unlimited", None, None, False),
    ("disabled30", 30, "disable", False),
]


@pytest.mark.timeout(90)
def test_throttled_time_counts_only_waits_for_the_share(tmp_path):
    sm_load.build()
    loads = [Load(region=tmp_path / f"{name}.region", sm_limit=limit, policy=policy)
             for name, limit, policy, _ in CONTAINERS]
    sm_load.measure(loads, tmp_path, SECONDS, warmup_s=WARMUP_S)
    window_ns = (SECONDS + WARMUP_S) * 1e9
    for (name, _, _, held), load in zip(CONTAINERS, loads):
        with region.open(load.region) as r:
            times = r.sm_times(0)
        assert times.paused_ns == 0, f"{name}: {times}"
        if held:
            # a 30 % share leaves most of the window to wait; one launching thread
            # cannot wait longer than the whole run (start-up included, generously)
            assert 0.2 * window_ns < times.throttled_ns < 3 * window_ns, f"{name}: {times}"
            assert 0 < times.busy_ns < window_ns, f"{name}: {times}"
        else:
            assert (times.throttled_ns, times.busy_ns) == (0, 0), f"{name}: {times}"
