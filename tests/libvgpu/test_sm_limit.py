"""SM share on the simulated GPU, through the real libvgpu.so: a container's
kernel throughput is its share of the unlimited rate, whatever launch call,
streams or threads it uses and however many processes it runs; no limit (or
policy `disable`) leaves launches alone.

Each measurement runs an unlimited reference at the same time on a second
simulated GPU (sm_load.measure), so a loaded machine slows both alike."""
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
TOLERANCE = 3.0           # points, DESIGN.md section 4
JITTER = 5.0
UNTHROTTLED = 90.0        # no limit in force: about the unlimited rate


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    sm_load.build()
    return tmp_path_factory.mktemp("sm")


def limited(workdir: Path, name: str, seconds: float, **load) -> sm_load.Measurement:
    return sm_load.measure([Load(region=workdir / f"{name}.region", **load)], workdir, seconds)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("level", [10, 30, 60])
def test_share_is_the_limit(workdir, level):
    m = limited(workdir, f"level{level}", LEVEL_SECONDS, sm_limit=level)
    assert abs(m.share() - level) <= TOLERANCE, f"{m.share():.1f}% at limit {level}%: {m.describe()}"
    assert m.jitter(level) <= JITTER, m.describe()


@pytest.mark.timeout(120)
def test_two_containers_split_by_their_limits(workdir):
    # two seconds before the window: the NVML correction needs one to start
    m = sm_load.measure([Load(region=workdir / "c30.region", sm_limit=30),
                         Load(region=workdir / "c70.region", sm_limit=70)], workdir, LEVEL_SECONDS,
                        warmup_s=2.0)
    assert abs(m.split(0) - 30) <= TOLERANCE, (
        f"split {m.split(0):.1f}:{m.split(1):.1f} ({m.share(0):.1f}% and {m.share(1):.1f}%): "
        f"{m.describe(0)}; {m.describe(1)}")


@pytest.mark.timeout(120)
def test_processes_of_one_container_share_one_budget(workdir):
    region = workdir / "shared.region"
    m = sm_load.measure([Load(region=region, sm_limit=30)] * 2, workdir, LEVEL_SECONDS)
    total = m.share(0) + m.share(1)
    assert abs(total - 30) <= TOLERANCE, f"together {total:.1f}%: {m.describe(0)}; {m.describe(1)}"


@pytest.mark.timeout(60)
def test_a_killed_process_leaves_the_budget_usable(workdir):
    """SIGKILL at any instant holds no lock and leaves the container its share."""
    region = workdir / "killed.region"
    victim = sm_load.start(Load(region=region, sm_limit=30), workdir / "device.state", 30,
                           time.monotonic_ns())
    time.sleep(2.0)
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=30)
    m = sm_load.measure([Load(region=region, sm_limit=30)], workdir, SHORT_SECONDS)
    assert abs(m.share() - 30) <= TOLERANCE, f"{m.share():.1f}% after a kill: {m.describe()}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode,streams,threads", [
    ("ex", 1, 1), ("coop", 1, 1), ("graph", 1, 1),   # cuLaunchKernelEx, cooperative, cuGraphLaunch
    ("kernel", 3, 1),                                 # one process, three streams
    ("kernel", 1, 2),                                 # two threads sharing one stream
])
def test_every_launch_form_is_throttled(workdir, mode, streams, threads):
    m = limited(workdir, f"{mode}{streams}{threads}", SHORT_SECONDS, sm_limit=30, mode=mode,
                streams=streams, threads=threads)
    assert abs(m.share() - 30) <= TOLERANCE, (
        f"{mode}, {streams} streams, {threads} threads: {m.share():.1f}%: {m.describe()}")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sm_limit,policy,expected", [
    (0, None, None), (100, None, None), (30, "disable", None), (30, "force", 30), (30, "default", 30)])
def test_policy_and_limit_values(workdir, sm_limit, policy, expected):
    """0 and 100 mean no limit, `disable` ignores the limit, `force` and `default` apply it."""
    m = limited(workdir, f"p{sm_limit}{policy}", POLICY_SECONDS, sm_limit=sm_limit, policy=policy)
    if expected is None:
        assert m.share() >= UNTHROTTLED, f"{m.share():.1f}% with no limit in force: {m.describe()}"
    else:
        assert abs(m.share() - expected) <= TOLERANCE, f"{m.share():.1f}%, expected {expected}%: {m.describe()}"
