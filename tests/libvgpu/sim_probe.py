"""bench/gpu/driver_probe.py `busy` on the simulated GPU, under libvgpu: the probe
`make gpu-check` runs on a real GPU, here reading GPU time from the simulator's timeline.
Each process stands for a container (its region; with a board, its activity stamp on it).

Shared by tests/libvgpu/test_sm_short_kernels.py and bench/sm_short_kernels.py."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIM_LIB = ROOT / "build" / "sim" / "lib"
LIBVGPU = ROOT / "build" / "libvgpu.so"
PROBE = [sys.executable, str(ROOT / "bench" / "gpu" / "driver_probe.py"), "busy"]
CARD_UUID = "GPU-453c5d90-9eaf-43fa-be71-c8ae8fc44d65"   # the simulator's card 0

sys.path.insert(0, str(ROOT / "bench" / "gpu"))
import gpu_env  # noqa: E402


def container_env(work: Path, name: str, pct: int, policy: str, board: Path | None = None,
                  libvgpu: Path = LIBVGPU, log_level: int = 1, nvml_period_ms: int = 0) -> dict:
    """A process of container `name` on the simulated card, its SM share `pct` under `policy`;
    NVML's per-process sample period `nvml_period_ms` where given (the simulator's otherwise)."""
    env = gpu_env.container_env(work, name, CARD_UUID, board=board)
    env.update(LD_PRELOAD=str(libvgpu), LD_LIBRARY_PATH=str(SIM_LIB), HAMI_SIM_STATE=str(work / "sim.state"),
               CUDA_DEVICE_SM_LIMIT=str(pct), GPU_CORE_UTILIZATION_POLICY=policy, LIBCUDA_LOG_LEVEL=str(log_level))
    if nvml_period_ms:
        (work / "sim.conf").write_text(f"util_period_ms = {nvml_period_ms}\n")
        env["HAMI_SIM_CONFIG"] = str(work / "sim.conf")
    return gpu_env.clean_env(**env)


def start(work: Path, name: str, pct: int, policy: str, kernel_us: int, seconds: int, mode: str = "time",
          board: Path | None = None, start_at: int = 0, libvgpu: Path = LIBVGPU,
          log_level: int = 1, nvml_period_ms: int = 0) -> subprocess.Popen:
    argv = PROBE + ["--kernel-us", str(kernel_us), "--seconds", str(seconds), "--mode", mode]
    if start_at:
        argv += ["--start-at", str(start_at)]
    env = container_env(work, name, pct, policy, board, libvgpu, log_level, nvml_period_ms)
    return subprocess.Popen(argv, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"{proc.args}: exit {proc.returncode}\n{err}")
    return json.loads(out.strip().splitlines()[-1])


def alone(work: Path, pct: int, kernel_us: int, seconds: int, libvgpu: Path = LIBVGPU) -> dict:
    """One `force` container's busy figures."""
    return finish(start(work, "alone", pct, "force", kernel_us, seconds, libvgpu=libvgpu))


def throttled_s(work: Path, name: str) -> float:
    """How long container `name`'s launches waited for its share (its region's count)."""
    from hami_runtime.node import region
    with region.open(work / f"{name}.region") as r:
        return r.sm_times(0).throttled_ns / 1e9


def pair_split(work: Path, policy: str, kernel_us: int, seconds: int, shares=(30, 70),
               libvgpu: Path = LIBVGPU, nvml_period_ms: int = 0) -> float:
    """Two containers on one board, the same fixed-work kernel in the same window (as tests/gpu
    does): the first one's % of the kernels both completed."""
    board = work / "board"
    start_at = time.clock_gettime_ns(time.CLOCK_MONOTONIC) + 2_000_000_000   # both warm
    procs = [start(work, f"c{pct}", pct, policy, kernel_us, seconds, "work", board, start_at, libvgpu,
                   nvml_period_ms=nvml_period_ms)
             for pct in shares]
    work_done = [finish(p)["kernels_in_window"] for p in procs]
    return 100 * work_done[0] / sum(work_done)
