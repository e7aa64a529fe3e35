"""Runs sm_load (sm_load.c) on the simulated GPU with libvgpu preloaded, and
turns its completion counts into shares of the unlimited rate.

Shared by tests/libvgpu/test_sm_limit.py and bench/sm_accuracy.py. Each caller
gives its own simulator state file, so its device timeline is private.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build"
SIM_LIB = BUILD / "sim" / "lib"
LIBVGPU = BUILD / "libvgpu.so"
SM_LOAD = BUILD / "tests" / "sm" / "sm_load"

KERNEL_US = 10000         # 10 ms kernels: launch gaps and scheduling noise stay small against them
WARMUP_S = 1.0


def build() -> None:
    """Builds libvgpu, the simulated driver and sm_load (make keeps it incremental)."""
    subprocess.run(["make", "-s", "-C", str(ROOT), "build", "sim", "sm-tests"],
                   check=True, timeout=300, stdout=subprocess.DEVNULL)


@dataclass(frozen=True)
class Load:
    """One process: the region (container) it belongs to and what that region says."""
    region: Path | None
    sm_limit: int | None = None
    policy: str | None = None
    mode: str = "kernel"
    streams: int = 1
    threads: int = 1


def load_env(load: Load, sim_state: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CUDA_", "GPU_CORE", "HAMI_", "LD_PRELOAD"))}
    env["LD_LIBRARY_PATH"] = str(SIM_LIB)
    env["HAMI_SIM_STATE"] = str(sim_state)
    env["LD_PRELOAD"] = str(LIBVGPU)
    if load.region is not None:
        env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = str(load.region)
    if load.sm_limit is not None:
        env["CUDA_DEVICE_SM_LIMIT"] = str(load.sm_limit)
    if load.policy is not None:
        env["GPU_CORE_UTILIZATION_POLICY"] = load.policy
    return env


def start(load: Load, sim_state: Path, seconds: float, start_at: int,
          kernel_us: int = KERNEL_US) -> subprocess.Popen:
    """One sm_load process whose window opens at `start_at` (CLOCK_MONOTONIC ns)."""
    return subprocess.Popen(
        [str(SM_LOAD), "-u", str(kernel_us), "-t", str(seconds), "-m", load.mode,
         "-n", str(load.streams), "-p", str(load.threads), "-s", str(start_at)],
        env=load_env(load, sim_state), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, seconds: float) -> dict:
    out, err = proc.communicate(timeout=seconds + WARMUP_S + 60)
    if proc.returncode != 0:
        raise RuntimeError(f"sm_load exited {proc.returncode}: {err.strip()}")
    return json.loads(out)


def run_together(loads: list[Load], sim_state: Path, seconds: float,
                 kernel_us: int = KERNEL_US) -> list[dict]:
    """Starts every load at once; all measure the same window of `seconds`."""
    start_at = time.monotonic_ns() + int(WARMUP_S * 1e9)
    procs = [start(load, sim_state, seconds, start_at, kernel_us) for load in loads]
    return [finish(proc, seconds) for proc in procs]


def run(load: Load, sim_state: Path, seconds: float, kernel_us: int = KERNEL_US) -> dict:
    return run_together([load], sim_state, seconds, kernel_us)[0]


def rate(result: dict) -> float:
    """Kernels completed per second over the window."""
    return result["completed"] / result["seconds"]


def share_pct(result: dict, unlimited_rate: float) -> float:
    return 100.0 * rate(result) / unlimited_rate


def per_second_pct(result: dict, unlimited_rate: float) -> list[float]:
    return [100.0 * n / unlimited_rate for n in result["per_second"]]


def jitter_pct(result: dict, unlimited_rate: float, target: float) -> float:
    """Largest distance of one second's share from the target."""
    return max(abs(p - target) for p in per_second_pct(result, unlimited_rate))
