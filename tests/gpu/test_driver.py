"""libvgpu's SM share and CUDA init on a real NVIDIA GPU, through the driver API alone (skipped
without one). The share is a share of GPU time (DESIGN.md §4): bench/gpu/driver_probe.py's kernel
fills every SM, and the time it takes is read by the kernel itself from the GPU's clock, so the
busy fraction is the kernels' time over the window, whatever the clocks do or the host adds."""
import bisect
import json
import statistics
import subprocess
import sys
import time

import pytest

import gpu_env

NO_GPU = gpu_env.no_gpu_reason()
pytestmark = pytest.mark.skipif(NO_GPU is not None, reason=str(NO_GPU))
PROBE = [sys.executable, str(gpu_env.DRIVER_PROBE)]
SECONDS = 5


def limiter_lines(stderr: str) -> list:
    """The SM limiter's last lines of each kind (LIBCUDA_LOG_LEVEL=4): what NVML read of this
    process, what it measured of the same periods, their span (whole periods of NVML's: how long
    they are on this GPU; the simulator's are 1/6 s unless set) and the charge factor, or why NVML's correction
    is off; whether the primer of throttled launches loaded; and sampled launches' measurements
    (primed or not) against their launch gaps."""
    lines = [line.split("SM limit: ", 1)[1] for line in stderr.splitlines() if "SM limit: " in line]
    return ([line for line in lines if "NVML" in line or "pid is unknown" in line][-6:]
            + [line for line in lines if "prime" in line and not line.startswith("a launch")][-2:]
            + [line for line in lines if line.startswith("a launch measured")][-6:])


def interleaving(mine: list, theirs: list) -> dict:
    """How one process's kernels lay among another's on the GPU (spans by the GPU's own clock):
    the % of its kernels' time during which one of the other's was in flight, and the % of its
    kernels that ran wholly inside one of the other's (that one preempted, and charged for it
    by its events)."""
    theirs = sorted(theirs)
    starts = [start for start, _ in theirs]
    inside = nested = 0
    for start, end in mine:
        i = bisect.bisect_right(starts, start) - 1
        if i >= 0 and theirs[i][1] >= end:
            nested += 1
        for other_start, other_end in theirs[max(i, 0):bisect.bisect_left(starts, end)]:
            inside += max(0, min(end, other_end) - max(start, other_start))
    total = sum(end - start for start, end in mine) or 1
    return {"inside_other_pct": 100 * inside / total, "nested_in_other_pct": 100 * nested / max(len(mine), 1)}


def driver_probe(args, libvgpu=True, timeout=120, **env):
    extra = {"LD_PRELOAD": gpu_env.LIBVGPU} if libvgpu else {}
    argv = PROBE + [str(a) for a in args]
    out = subprocess.run(argv, env=gpu_env.clean_env(**extra, **env), capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, gpu_env.failure(argv, out)
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "limiter": limiter_lines(out.stderr)}


@pytest.fixture(scope="module")
def uuid():
    return gpu_env.device0()["uuid"]


def busy(kernel_us, seconds=SECONDS, mode="time", **env):
    return driver_probe(["busy", "--kernel-us", kernel_us, "--seconds", seconds, "--mode", mode], **env)


def test_the_measure_sees_an_unlimited_gpu_busy(figures):
    """The yardstick: with no limit, the kernels keep the GPU busy (the old matmul probe kept it
    81 % busy and read its throughput as 100 %)."""
    native = busy(1000, libvgpu=False)
    under = busy(1000)
    figures.update(native_busy_pct=native["busy_pct"], libvgpu_no_limit_busy_pct=under["busy_pct"],
                   kernel_us_median=native["kernel_us_median"], grid=native["grid"], clock=native["clock"])
    assert native["clock"] == "kernel", "the kernel wrote no timestamps: is this a real GPU?"
    assert native["busy_pct"] >= 95 and under["busy_pct"] >= 95, (native, under)


@pytest.mark.parametrize("pct", [30, 60])
@pytest.mark.parametrize("kernel_us", [50, 5000])
def test_force_holds_the_share_of_gpu_time(pct, kernel_us, figures):
    """Bar: at 30 and 60 % the GPU is busy that fraction of the time within ±3 points, per-second
    jitter ≤ 5, for kernels from 50 µs to 5 ms; `force` alone (no one else on the GPU)."""
    got = busy(kernel_us, CUDA_DEVICE_SM_LIMIT=pct, GPU_CORE_UTILIZATION_POLICY="force", LIBCUDA_LOG_LEVEL="4")
    jitter = max(abs(s - pct) for s in got["per_second_pct"])
    figures.update(busy_pct=got["busy_pct"], jitter_points=jitter, per_second_pct=got["per_second_pct"],
                   kernel_us_median=got["kernel_us_median"], kernels=got["kernels"], limiter_nvml=got["limiter"])
    assert abs(got["busy_pct"] - pct) <= 3, got
    assert jitter <= 5, got["per_second_pct"]


def test_default_alone_runs_at_full_speed(tmp_path, uuid, figures):
    """Bar: `default` is work-conserving: alone on the GPU (the only container on the activity
    board), a 30 % container runs at ≥ 95 % of the unlimited rate."""
    env = gpu_env.container_env(tmp_path, "alone", uuid, board=tmp_path / "board")
    got = busy(1000, CUDA_DEVICE_SM_LIMIT=30, GPU_CORE_UTILIZATION_POLICY="default", **env)
    figures.update(busy_pct=got["busy_pct"])
    assert got["busy_pct"] >= 95, got


def test_default_two_containers_split_30_70(tmp_path, uuid, figures):
    """Bar: two busy containers at 30 and 70 % under `default` split the GPU 30:70 ± 3. Each is a
    container of its own (region, stamp on one activity board); both run the same fixed-work
    kernel in the same window, so the kernels each completes are its share of the GPU's time
    (a kernel preempted by the other's time slice still does all its work). Recorded beside it:
    how each one's kernels lay among the other's (which one's events take in the other's
    kernels decides which one is charged for them)."""
    board = tmp_path / "board"
    start_at = time.clock_gettime_ns(time.CLOCK_MONOTONIC) + 4_000_000_000   # both warm, both busy
    procs = []
    for pct in (30, 70):
        env = gpu_env.container_env(tmp_path, f"c{pct}", uuid, board=board)
        env.update(LD_PRELOAD=str(gpu_env.LIBVGPU), CUDA_DEVICE_SM_LIMIT=str(pct),
                   GPU_CORE_UTILIZATION_POLICY="default", LIBCUDA_LOG_LEVEL="4")  # the limiter's NVML lines
        procs.append(subprocess.Popen(
            PROBE + ["busy", "--kernel-us", "1000", "--seconds", "8", "--mode", "work", "--start-at", str(start_at),
                     "--spans", tmp_path / f"spans{pct}.json"],
            env=gpu_env.clean_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    got, nvml = [], []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        assert proc.returncode == 0, gpu_env.failure(proc.args, done)
        got.append(json.loads(out.strip().splitlines()[-1]))
        # what NVML said of each one's time slices beside the other's: the charge factor's source
        nvml.append(limiter_lines(err))
    work = [g["kernels_in_window"] for g in got]
    split = 100 * work[0] / sum(work)
    spans = [json.loads((tmp_path / f"spans{pct}.json").read_text()) for pct in (30, 70)]
    figures.update(split_30=split, kernels=work, busy_pct=[g["busy_pct"] for g in got],
                   kernel_us_median=[g["kernel_us_median"] for g in got], limiter_nvml_30_70=nvml,
                   interleaving_30_70=[interleaving(spans[0], spans[1]), interleaving(spans[1], spans[0])])
    assert abs(split - 30) <= 3, got


def test_libvgpu_adds_at_most_5_ms_to_cuda_init(figures):
    """Bar: libvgpu adds ≤ 5 ms to a process's CUDA init (cuInit, primary context, first 1 MiB
    allocation; timed in the process from before the driver is loaded). Fresh processes, with
    and without libvgpu alternately; the medians."""
    runs = {False: [], True: []}
    for _ in range(9):
        for libvgpu in (False, True):
            runs[libvgpu].append(driver_probe(["init"], libvgpu=libvgpu))
    median = {(lib, step): statistics.median(r[step] for r in runs[lib])
              for lib in runs for step in ("driver_init_ms", "cuinit_ms", "context_ms", "first_alloc_ms")}
    native = [r["driver_init_ms"] for r in runs[False]]
    under = [r["driver_init_ms"] for r in runs[True]]
    added = median[True, "driver_init_ms"] - median[False, "driver_init_ms"]
    figures.update(native_ms=median[False, "driver_init_ms"], libvgpu_ms=median[True, "driver_init_ms"],
                   added_ms=added, processes=len(native),
                   added_by_step_ms={step: median[True, step] - median[False, step]
                                     for step in ("cuinit_ms", "context_ms", "first_alloc_ms")})
    assert added <= 5, (sorted(native), sorted(under))
