"""SM share on the simulated GPU, through the real libvgpu.so: a container's
kernel throughput is its share of the unlimited rate, whatever launch call it
uses and however many processes it runs; no limit costs nothing."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sm_load  # noqa: E402
from sm_load import Load  # noqa: E402

LEVEL_SECONDS = 5         # the bench measures 10 s; 5 s keeps the suite short
SHORT_SECONDS = 3
TOLERANCE = 3.0           # points, DESIGN.md section 4
JITTER = 5.0


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    """A private simulated device and its unlimited kernel rate."""
    sm_load.build()
    base = tmp_path_factory.mktemp("sm")
    state = base / "sim.state"
    unlimited = sm_load.run(Load(region=base / "unlimited.region"), state, SHORT_SECONDS)
    rate = sm_load.rate(unlimited)
    ideal = 1e6 / sm_load.KERNEL_US
    assert rate > 0.9 * ideal, f"unlimited run reached {rate:.1f}/s of {ideal:.1f}/s"
    return base, state, rate


@pytest.mark.timeout(120)
@pytest.mark.parametrize("level", [10, 30, 60])
def test_share_is_the_limit(sim, level):
    base, state, unlimited = sim
    result = sm_load.run(Load(region=base / f"level{level}.region", sm_limit=level), state,
                         LEVEL_SECONDS)
    achieved = sm_load.share_pct(result, unlimited)
    series = sm_load.per_second_pct(result, unlimited)
    assert abs(achieved - level) <= TOLERANCE, f"{achieved:.1f}% at limit {level}% ({series})"
    assert sm_load.jitter_pct(result, unlimited, level) <= JITTER, f"per second: {series}"


@pytest.mark.timeout(120)
def test_two_containers_split_by_their_limits(sim):
    base, state, unlimited = sim
    low, high = sm_load.run_together(
        [Load(region=base / "c30.region", sm_limit=30), Load(region=base / "c70.region", sm_limit=70)],
        state, LEVEL_SECONDS)
    split = 100.0 * low["completed"] / (low["completed"] + high["completed"])
    assert abs(split - 30) <= TOLERANCE, (
        f"split {split:.1f}:{100 - split:.1f} "
        f"({sm_load.share_pct(low, unlimited):.1f}% and {sm_load.share_pct(high, unlimited):.1f}%)")


@pytest.mark.timeout(120)
def test_processes_of_one_container_share_one_budget(sim):
    base, state, unlimited = sim
    region = base / "shared.region"
    results = sm_load.run_together([Load(region=region, sm_limit=30)] * 2, state, LEVEL_SECONDS)
    total = sum(sm_load.share_pct(r, unlimited) for r in results)
    assert abs(total - 30) <= TOLERANCE, f"together {total:.1f}% at limit 30%"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["ex", "coop", "graph"])
def test_every_launch_form_is_throttled(sim, mode):
    base, state, unlimited = sim
    result = sm_load.run(Load(region=base / f"{mode}.region", sm_limit=30, mode=mode), state,
                         SHORT_SECONDS)
    achieved = sm_load.share_pct(result, unlimited)
    assert abs(achieved - 30) <= TOLERANCE, f"{mode}: {achieved:.1f}% at limit 30%"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sm_limit,policy", [(None, None), (0, None), (100, None), (30, "disable")])
def test_no_limit_means_no_throttle(sim, sm_limit, policy):
    base, state, unlimited = sim
    result = sm_load.run(Load(region=base / f"off{sm_limit}{policy}.region", sm_limit=sm_limit,
                              policy=policy), state, SHORT_SECONDS)
    assert sm_load.share_pct(result, unlimited) >= 90.0


@pytest.mark.timeout(60)
def test_force_policy_limits(sim):
    base, state, unlimited = sim
    result = sm_load.run(Load(region=base / "force.region", sm_limit=30, policy="force"), state,
                         SHORT_SECONDS)
    assert abs(sm_load.share_pct(result, unlimited) - 30) <= TOLERANCE
