"""SM share on the simulated GPU, through the real libvgpu.so: a container's
kernel throughput is its share of the unlimited rate, whatever launch call,
streams or threads it uses and however many processes it runs; no limit (or
policy `disable`) leaves launches alone."""
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sm_load  # noqa: E402
from sm_load import Load  # noqa: E402

LEVEL_SECONDS = 5         # the bench measures 10 s; 5 s keeps the suite short
SHORT_SECONDS = 3
POLICY_SECONDS = 2
UNTHROTTLED = 90.0        # no limit: about the unlimited rate (the run is as noisy as the baseline)
TOLERANCE = 3.0           # points, DESIGN.md section 4
JITTER = 5.0


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    """A private simulated device (own state file) and its unlimited kernel rate."""
    sm_load.build()
    base = tmp_path_factory.mktemp("sm")
    state = base / "sim.state"
    unlimited = sm_load.run(Load(region=base / "unlimited.region"), state, SHORT_SECONDS)
    rate = sm_load.rate(unlimited)
    ideal = 1e6 / sm_load.KERNEL_US
    assert rate > 0.9 * ideal, f"unlimited run reached {rate:.1f}/s of {ideal:.1f}/s"
    return base, state, rate


def limited_share(sim, load: Load, seconds: float) -> tuple[float, list[float]]:
    base, state, unlimited = sim
    result = sm_load.run(load, state, seconds)
    return sm_load.share_pct(result, unlimited), sm_load.per_second_pct(result, unlimited)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("level", [10, 30, 60])
def test_share_is_the_limit(sim, level):
    achieved, series = limited_share(sim, Load(region=sim[0] / f"level{level}.region", sm_limit=level),
                                     LEVEL_SECONDS)
    assert abs(achieved - level) <= TOLERANCE, f"{achieved:.1f}% at limit {level}% ({series})"
    assert max(abs(p - level) for p in series) <= JITTER, f"per second: {series}"


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
def test_a_killed_process_leaves_the_budget_usable(sim):
    """SIGKILL at any instant holds no lock and leaves the container its share."""
    base, state, unlimited = sim
    region = base / "killed.region"
    victim = sm_load.start(Load(region=region, sm_limit=30), state, 30, time.monotonic_ns())
    time.sleep(2.0)
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=30)
    achieved, series = limited_share(sim, Load(region=region, sm_limit=30), SHORT_SECONDS)
    assert abs(achieved - 30) <= TOLERANCE, f"{achieved:.1f}% after a kill ({series})"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode,streams,threads", [
    ("ex", 1, 1), ("coop", 1, 1), ("graph", 1, 1),   # cuLaunchKernelEx, cooperative, cuGraphLaunch
    ("kernel", 3, 1),                                 # one process, three streams
    ("kernel", 1, 2),                                 # two threads sharing one stream
])
def test_every_launch_form_is_throttled(sim, mode, streams, threads):
    load = Load(region=sim[0] / f"{mode}{streams}{threads}.region", sm_limit=30, mode=mode,
                streams=streams, threads=threads)
    achieved, series = limited_share(sim, load, SHORT_SECONDS)
    assert abs(achieved - 30) <= TOLERANCE, (
        f"{mode}, {streams} streams, {threads} threads: {achieved:.1f}% ({series})")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sm_limit,policy,expected", [
    (0, None, None), (100, None, None), (30, "disable", None), (30, "force", 30), (30, "default", 30)])
def test_policy_and_limit_values(sim, sm_limit, policy, expected):
    """0 and 100 mean no limit, `disable` ignores the limit, `force` and `default` apply it."""
    load = Load(region=sim[0] / f"p{sm_limit}{policy}.region", sm_limit=sm_limit, policy=policy)
    achieved, series = limited_share(sim, load, POLICY_SECONDS)
    if expected is None:
        assert achieved >= UNTHROTTLED, f"{achieved:.1f}% with no limit in force ({series})"
    else:
        assert abs(achieved - expected) <= TOLERANCE, f"{achieved:.1f}%, expected {expected}% ({series})"
