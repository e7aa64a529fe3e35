"""SM share of short kernels as GPU time, on the simulated GPU, through the same probe
`make gpu-check` runs on a real one (bench/gpu/driver_probe.py `busy`): the kernels' own time
inside the window over the window.

The simulator times kernels as a GPU does (tests/simgpu/cu_stream.c): a launch's CPU time and
dispatch sit between a start event recorded on an idle stream and the kernel, and NVML counts
the dispatch busy, as on the H200 where a 30 % share of 50 us kernels read 25.0 % of GPU time
while ~10 us of dispatch a launch was billed and NVML's correction gave none back (the limiter
before throttled launches were primed reads 25 % here too). Only the kernels' run may be
charged, so 10 and 50 us kernels get their share too, and two containers at 30 and 70 % split
the work 30 : 70, though the GPU time-slices between them and the one preempted is charged for
the other's run by its events (tests/simgpu/sim_engine.c), as on the H200.

Timed on a shared machine: the bounds are wider than DESIGN.md's +-3 (bench/sm_short_kernels.py
holds that), yet narrow enough that billing the launch gap (about 20 % of GPU time for 10 us
kernels at 30 %) fails them."""
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sim_probe  # noqa: E402

SECONDS = 3
POINTS = 4.0
# Below this the share held a process back for less than a sixth of its run: what kept it short
# of the share was the CPU (a loaded machine starves the launching loop of 10 us kernels), not
# the limiter. Held to its share, it waits 1.7-2.1 s of a 3 s run; starved, 0.1-0.3 s.
STARVED_HELD_S = 0.5


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pct", [30, 60])
@pytest.mark.parametrize("kernel_us", [10, 50])
def test_force_share_of_short_kernels_is_gpu_time(tmp_path, kernel_us, pct):
    got = sim_probe.alone(tmp_path, pct, kernel_us, SECONDS)
    assert got["clock"] == "nominal"
    first_second = got["per_second_pct"][0]
    assert got["busy_pct"] <= pct + POINTS and first_second <= pct + 2 * POINTS, got
    if got["busy_pct"] < pct - POINTS or first_second < pct - 2 * POINTS:  # the first second too
        held = sim_probe.throttled_s(tmp_path, "alone")
        assert held < STARVED_HELD_S, f"short of its share though held back {held:.2f} s: {got}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("policy", ["default", "force"])
@pytest.mark.parametrize("kernel_us, seconds, nvml_period_ms", [(50, SECONDS, 0), (1000, 8, 1000)])
def test_two_containers_split_30_70(tmp_path, kernel_us, seconds, nvml_period_ms, policy):
    """1 ms kernels in 8 s, as tests/gpu runs them: the 30 % one's kernels preempt the 70 % one's,
    whose events take them in (tests/simgpu/sim_engine.c) until NVML's correction has learnt how
    much, here from NVML's slowest periods (1 s); the build the H200 ran (84b4dcf, its correction
    not running) split 34.6-34.8 there and 34.0-35.0 here."""
    split = sim_probe.pair_split(tmp_path, policy, kernel_us, seconds, nvml_period_ms=nvml_period_ms)
    assert abs(split - 30) <= POINTS, split


@pytest.mark.timeout(120)
def test_the_nvml_correction_reads_the_driver_as_it_answers(tmp_path):
    """The driver wants a utilisation buffer as large as its own sample buffer, however few
    processes ran (drivers are reported to want 100 entries; the simulator answers the same):
    the limiter takes the size it is told, so its NVML correction runs. On the H200 the
    64-entry buffer it had never gave a correction; the grown one did."""
    proc = sim_probe.start(tmp_path, "alone", 30, "force", 50, 2, log_level=4)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert "SM limit: NVML" in err and "process utilisation answered" not in err, err[-2000:]


BURSTY = """
import time
from simcuda import Cuda
c = Cuda("libcuda.so.1")
c.init(0)
s = c.stream()
t0 = time.monotonic()
busy = 0                                       # 5 ms kernels launched while it had demand
while time.monotonic() - t0 < 9:
    if int((time.monotonic() - t0) / 1.5) % 2 == 0:     # 1.5 s of demand, 1.5 s of none
        c.kernel(5000, s)
        busy += 1
        if busy % 4 == 0:
            c.sync(s)
    else:
        c.sync(s)
        time.sleep(0.01)
c.sync(s)
print(busy * 5e-3 / 4.5 * 100)                 # % of the GPU's time in its 4.5 s of demand
"""


@pytest.mark.timeout(60)
def test_a_job_that_pauses_is_judged_by_what_ran_when(tmp_path):
    """NVML records a process's use per period, at the period's end (1 s periods here, its
    slowest), and the limiter judges those periods by the launches made in them, not by when it
    harvested their measurements: a job whose demand comes and goes has its last launches before
    a pause harvested when it resumes. Judged by harvest and against the last second, such a job
    read more than NVML counted: in two runs of three its charge factor fell to 0.43-0.53 and
    its busy stretches got 44-45 % of the GPU's time (31 % now). Under load a factor below 1 is
    right where the CPU held a launch between its events (time measured, not run); running past
    the share is not."""
    env = sim_probe.container_env(tmp_path, "bursty", 30, "force", log_level=4, nvml_period_ms=1000)
    env["PYTHONPATH"] = str(sim_probe.ROOT / "tests" / "simgpu")
    proc = subprocess.run([sys.executable, "-c", BURSTY], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    judged = [line.split("SM limit: NVML ", 1)[1] for line in proc.stderr.splitlines() if "SM limit: NVML" in line]
    busy_pct = float(proc.stdout.strip().splitlines()[-1])
    assert judged and busy_pct <= 30 + 4, (busy_pct, judged)   # the share, and a burst after each pause


CONTEXT_RESET = """
import ctypes, sys
from simcuda import Cuda
c = Cuda("libcuda.so.1")
for _ in range(2):
    c.init(0)
    c.function = None                            # the module went with the last context
    s = c.stream()
    for _ in range(1000):                        # past the first burst: throttled
        c.kernel(50, s)
    c.sync(s)
    c.call("cuDevicePrimaryCtxReset_v2", 0)      # the context goes, and the limiter's kernel with it
"""


@pytest.mark.timeout(60)
def test_the_primer_goes_with_its_context(tmp_path):
    """Throttled launches are primed by an empty kernel the limiter loads in the launching
    context; a reset context takes that kernel with it, and the next context gets its own
    (never the old one's handle)."""
    env = sim_probe.container_env(tmp_path, "reset", 30, "force", log_level=4)
    env["PYTHONPATH"] = str(sim_probe.ROOT / "tests" / "simgpu")
    proc = subprocess.run([sys.executable, "-c", CONTEXT_RESET], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = [line for line in proc.stderr.splitlines() if "the primer is loaded" in line]
    assert len(loaded) == 2 and "cannot be loaded" not in proc.stderr, proc.stderr[-2000:]


PACED = """
import json, sys, time
from simcuda import Cuda
c = Cuda("libcuda.so.1")
c.init(0)
s = c.stream()
period = float(sys.argv[1])
for _ in range(20):
    c.kernel(50, s)
c.sync(s)
t0 = time.perf_counter()
n = 0
while time.perf_counter() - t0 < 3:
    c.kernel(50, s)
    n += 1
    while time.perf_counter() < t0 + n * period:  # the next launch's time: late ones go at once
        pass
c.sync(s)
print(json.dumps(n * 50e-6 / (time.perf_counter() - t0) * 100))
"""


def paced_job(work: Path, libvgpu: Path = sim_probe.LIBVGPU) -> tuple:
    """50 us kernels paced at 27 % of the GPU's time, in a 30 % `force` share: the share of the
    GPU's time it got and the seconds its launches waited for the share."""
    from hami_runtime.node import region
    env = sim_probe.container_env(work, "paced", 30, "force", libvgpu=libvgpu)
    env["PYTHONPATH"] = str(sim_probe.ROOT / "tests" / "simgpu")
    proc = subprocess.run([sys.executable, "-c", PACED, str(50e-6 / 0.27)], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with region.open(work / "paced.region") as shared:
        return float(proc.stdout.strip().splitlines()[-1]), shared.sm_times(0).throttled_ns / 1e9


@pytest.mark.timeout(60)
def test_a_job_below_its_share_is_not_held(tmp_path):
    """Bar: a job whose demand is below its share is not slowed. Billed with their dispatch (10 us
    a launch here, as on an H200) the paced kernels would cost 32 % and wait for the share (0.8 s
    of 3 when only launches that had waited were primed); launched near the share they are
    primed, so the job runs as paced and its launches do not wait."""
    busy, throttled_s = paced_job(tmp_path)
    assert throttled_s < 0.4 and busy > 25, (busy, throttled_s)
