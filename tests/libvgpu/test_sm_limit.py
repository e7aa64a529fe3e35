"""SM share on the simulated GPU, through the real libvgpu.so: a container's
kernel throughput is about its share of the unlimited rate, whatever launch
call, streams or threads it uses and however many processes it runs; no limit
(or policy `disable`) leaves launches alone; policy `default` holds the share
only while another container's work is on the GPU, `force` always.

Each measurement runs an unlimited reference at the same time on a second
simulated GPU (sm_load.measure), so a loaded machine slows both alike. These
are timed on a shared machine: they assert direction and coarse bounds only
(COARSE points); the accuracy figures come from bench/sm_accuracy.py."""
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
COARSE = 10.0             # points; the bench holds the +-3 of DESIGN.md section 4
UNTHROTTLED = 90.0        # no limit in force: about the unlimited rate
LENT = 70.0               # `default` alone: most of the unlimited rate


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    sm_load.build()
    return tmp_path_factory.mktemp("sm")


def limited(workdir: Path, name: str, seconds: float, **load) -> sm_load.Measurement:
    return sm_load.measure([Load(region=workdir / f"{name}.region", **load)], workdir, seconds)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("level", [10, 30, 60])
def test_share_is_the_limit(workdir, level):
    m = limited(workdir, f"level{level}", LEVEL_SECONDS, sm_limit=level, policy="force")
    assert abs(m.share() - level) <= COARSE, f"{m.share():.1f}% at limit {level}%: {m.describe()}"


@pytest.mark.timeout(120)
def test_two_containers_split_by_their_limits(workdir):
    """Policy `default`: each is the other's busy neighbour, so both are held."""
    # two seconds before the window: the NVML correction needs one to start
    m = sm_load.measure([Load(region=workdir / "c30.region", sm_limit=30),
                         Load(region=workdir / "c70.region", sm_limit=70)], workdir, LEVEL_SECONDS,
                        warmup_s=2.0)
    assert abs(m.split(0) - 30) <= COARSE, (
        f"split {m.split(0):.1f}:{m.split(1):.1f} ({m.share(0):.1f}% and {m.share(1):.1f}%): "
        f"{m.describe(0)}; {m.describe(1)}")


@pytest.mark.timeout(120)
def test_processes_of_one_container_share_one_budget(workdir):
    """Two processes at 30 % in one container get about 30 % together, not 60 %."""
    region = workdir / "shared.region"
    m = sm_load.measure([Load(region=region, sm_limit=30, policy="force")] * 2, workdir, LEVEL_SECONDS)
    total = m.share(0) + m.share(1)
    assert abs(total - 30) <= COARSE, f"together {total:.1f}%: {m.describe(0)}; {m.describe(1)}"


@pytest.mark.timeout(60)
def test_a_killed_process_leaves_the_budget_usable(workdir):
    """SIGKILL at any instant holds no lock and leaves the container its share."""
    region = workdir / "killed.region"
    victim = sm_load.start(Load(region=region, sm_limit=30, policy="force"), workdir / "device.state", 30,
                           time.monotonic_ns())
    time.sleep(2.0)
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=30)
    m = sm_load.measure([Load(region=region, sm_limit=30, policy="force")], workdir, SHORT_SECONDS)
    assert abs(m.share() - 30) <= COARSE, f"{m.share():.1f}% after a kill: {m.describe()}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode,streams,threads", [
    ("ex", 1, 1), ("coop", 1, 1), ("graph", 1, 1),   # cuLaunchKernelEx, cooperative, cuGraphLaunch
    ("captured", 1, 1),                               # replays of a graph captured from a stream
    ("kernel", 3, 1),                                 # one process, three streams
    ("kernel", 1, 2),                                 # two threads sharing one stream
])
def test_every_launch_form_is_throttled(workdir, mode, streams, threads):
    m = limited(workdir, f"{mode}{streams}{threads}", SHORT_SECONDS, sm_limit=30, policy="force",
                mode=mode, streams=streams, threads=threads)
    assert abs(m.share() - 30) <= COARSE, (
        f"{mode}, {streams} streams, {threads} threads: {m.share():.1f}%: {m.describe()}")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sm_limit,policy,expected", [
    (0, None, None), (100, None, None), (30, "disable", None), (30, "force", 30)])
def test_policy_and_limit_values(workdir, sm_limit, policy, expected):
    """0 and 100 mean no limit, `disable` ignores the limit, `force` applies it."""
    m = limited(workdir, f"p{sm_limit}{policy}", POLICY_SECONDS, sm_limit=sm_limit, policy=policy)
    if expected is None:
        assert m.share() >= UNTHROTTLED, f"{m.share():.1f}% with no limit in force: {m.describe()}"
    else:
        assert abs(m.share() - expected) <= COARSE, f"{m.share():.1f}%, expected {expected}%: {m.describe()}"


@pytest.mark.timeout(60)
def test_default_policy_lends_an_idle_gpu(workdir):
    """Alone on its GPU, a `default` 30 % container runs at most of the unlimited
    rate: far faster than a `force` 30 % one."""
    lent = limited(workdir, "lent", POLICY_SECONDS, sm_limit=30, policy="default")
    capped = limited(workdir, "capped", POLICY_SECONDS, sm_limit=30, policy="force")
    assert lent.share() >= LENT, f"`default` alone: {lent.share():.1f}%: {lent.describe()}"
    assert lent.share() >= 2 * capped.share(), (
        f"`default` {lent.share():.1f}% against `force` {capped.share():.1f}%")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("policy,held", [("default", True), ("force", True), ("disable", False)])
def test_a_busy_neighbour_holds_the_share(workdir, policy, held):
    """Next to another container's unlimited work, a 30 % container is held well
    below what it gets without a limit (`default`, `force`); `disable` never is."""
    m = sm_load.measure([Load(region=workdir / f"held-{policy}.region", sm_limit=30, policy=policy),
                         Load(region=workdir / f"neighbour-{policy}.region")], workdir, SHORT_SECONDS)
    ours, theirs = m.share(0), m.share(1)
    if held:
        assert ours <= 30 + COARSE and theirs > ours, (
            f"{policy}: {ours:.1f}% beside {theirs:.1f}%: {m.describe(0)}; {m.describe(1)}")
    else:
        assert ours >= 50 - COARSE, f"disable: {ours:.1f}% beside {theirs:.1f}%: {m.describe(0)}"
